"""Execute one run: train task after task, evaluate every stage from the strategy's scores,
checkpoint after every task, and store the result JSON with its predictions sidecar.

Finished runs with the same resolved config are skipped; killed runs resume from their last
finished task, with the loss scaler's state, so a resumed run ends with the same numbers. A stored
result is never replaced unsaid (``ResultStore.refusal``, checked in ``preflight`` for every run
before any computes), and each stage's scores are checked against the contract before any metric. Every
launcher (``benchmarks.runner.launcher``) ends up here, in this process or in a worker or job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
import warnings
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from tqdm.auto import tqdm

from benchmarks.backbone import check_weights
from benchmarks.core.environment import (
    Threads,
    environment,
    peak_memory,
    reset_peak_memory,
    seed_everything,
)
from benchmarks.core.errors import UserError
from benchmarks.core.heartbeat_lock import read_holder
from benchmarks.core.metrics import predicted_classes, stage_metrics, summarize
from benchmarks.data.class_orders import resolve_class_order
from benchmarks.data.datasets import TransformedDataset, load_zero_shot_target
from benchmarks.data.streams import split_classes, spread_indices
from benchmarks.data.transforms import eval_transform
from benchmarks.runner.building import ResolvedRun, backbone_spec, build_run, load_run_data, resolve
from benchmarks.runner.live_log import LiveLog, TrainingLog
from benchmarks.runner.results import (
    SCHEMA_VERSION,
    Predictions,
    ResultStore,
    RunCost,
    RunProgress,
    RunResult,
    StageResult,
    config_hash,
    safe_label,
)
from benchmarks.runner.suites import RunLimits, RunSpec
from strategies.contract import evaluate, optional
from strategies.registry import get_strategy


@lru_cache(maxsize=4)
def _zero_shot_target(name: str, data_root: str):
    return load_zero_shot_target(name, data_root)


def preflight(
    runs: list[RunSpec],
    data_root: str,
    *,
    store: ResultStore | None = None,
    force: bool = False,
    save_models: bool = False,
) -> None:
    """Check every run's strategy, options, data, class order, task count and weights up front,
    so that a mistake stops the suite before any long work instead of in the middle of it. With
    ``store``: no run may replace a stored result unsaid (``ResultStore.refusal``: a newer schema,
    another label sharing the folder, another config without ``force``); with ``save_models``:
    every run's strategy can save its model."""
    folders: dict[tuple[str, str], str] = {}
    for spec in runs:  # two labels, one folder (a:b and a_b): each run would overwrite the other
        folder = safe_label(spec.label)
        if (other := folders.setdefault((spec.dataset, folder), spec.label)) != spec.label:
            raise UserError(
                f"runs {other!r} and {spec.label!r} would share the result folder {folder!r}; "
                "rename one of the variants"
            )
    for spec in runs:
        resolved = resolve(spec, data_root)
        if save_models:
            _check_save_model(spec, resolved)
        if store is not None:  # before any run computes, not when the run comes up
            _refuse_replacing(store, spec, config_hash(resolved.config), force, resolved.config)
        data = load_run_data(spec, data_root)
        order = resolve_class_order(spec.class_order, len(data.class_names), spec.dataset)
        split_classes(order, spec.n_tasks, spec.dataset)
        for target in spec.zero_shot_targets:
            strategy_cls = get_strategy(spec.strategy)
            if not all(hasattr(strategy_cls, m) for m in ("zero_shot_text", "zero_shot_predictions")):
                raise UserError(
                    f"strategy {spec.strategy} has no zero-shot predictor; drop zero_shot_targets "
                    "from the suite or run a strategy that has one (gr4cil)"
                )
            _zero_shot_target(target, data_root)
    for backbone in {backbone_spec(spec) for spec in runs}:
        check_weights(backbone)


def execute(
    spec: RunSpec,
    store: ResultStore,
    data_root: str,
    *,
    force: bool = False,
    show_progress: bool = True,
    task_lines: bool = False,
    save_model: bool = False,
    log: tuple[str, ...] = (),
    project: str = "",
    threads: Threads = "auto",
) -> tuple[dict | None, str]:
    """Run (or resume, or skip) one run under its lock. Returns its result and what happened; the
    result is None when another process holds the run's lock. ``show_progress``: progress bars;
    ``task_lines``: one line on stderr per finished task instead (a log that is not a terminal);
    ``log``: the live logs to write (``benchmarks.runner.live_log``), ``project`` naming the W&B
    project; ``threads``: the setting the caller gave ``set_threads``, recorded in the result."""
    resolved = resolve(spec, data_root)
    cfg_hash = config_hash(resolved.config)
    _refuse_replacing(store, spec, cfg_hash, force, resolved.config)
    if not force and (done := store.finished(spec.key, cfg_hash)) is not None:
        return done, "cached"
    if save_model:
        _check_save_model(spec, resolved)
    lock = store.lock(spec.key)
    if not lock.acquire():
        holder = read_holder(lock.path)
        return None, f"skipped, running elsewhere ({holder.describe() if holder else 'locked'})"
    try:
        _refuse_replacing(store, spec, cfg_hash, force, resolved.config)  # another process may have stored it
        if not force and (done := store.finished(spec.key, cfg_hash)) is not None:
            result, status = done, "cached (finished by another process)"
        else:
            live = LiveLog(log, store.root, spec.key, {**resolved.config, "suite": project}) if log else None
            with live or contextlib.nullcontext():
                context = RunContext(
                    spec,
                    store,
                    data_root,
                    resolved,
                    cfg_hash,
                    force=force,
                    show_progress=show_progress,
                    task_lines=task_lines,
                    save_model=save_model,
                    live=live,
                    threads=threads,
                )
                result, status = _compute(context)
    except (KeyboardInterrupt, SystemExit):  # stopped, not failed (SLURM's requeue exits this way)
        lock.release()
        raise
    except BaseException as err:  # a user error says it all; anything else is named
        message = str(err) if isinstance(err, UserError) else f"{type(err).__name__}: {err}"
        lock.release(error=message.splitlines()[0] if message else type(err).__name__)
        raise
    lock.release(finished=True)
    if lock.took_over is not None:
        status += f"; took over a stale lock of {lock.took_over.describe()}"
    return result, status


def _refuse_replacing(store: ResultStore, spec: RunSpec, cfg_hash: str, force: bool, config: dict) -> None:
    """One line, and no run, where computing ``spec`` would replace its stored result unsaid."""
    if (why := store.refusal(spec.key, cfg_hash, force, config)) is not None:
        raise UserError(why)


def _check_save_model(spec: RunSpec, resolved: ResolvedRun) -> None:
    if not hasattr(resolved.strategy_cls, "save_model"):
        raise UserError(
            f"{spec.strategy} has no save_model, so --save-models cannot keep its model; drop the flag"
        )


@dataclass(frozen=True)
class RunContext:
    """One run under way: what computing it needs besides its stream and strategy."""

    spec: RunSpec
    store: ResultStore
    data_root: str
    resolved: ResolvedRun
    cfg_hash: str
    force: bool = False
    show_progress: bool = True
    task_lines: bool = False
    save_model: bool = False
    live: LiveLog | None = None  # the run's live log (benchmarks.runner.live_log), if any
    threads: Threads = "auto"  # the run's thread setting (``set_threads``), recorded in its env


def _compute(context: RunContext) -> tuple[dict, str]:
    """Train and evaluate one run, resuming from its checkpoint; store the result."""
    spec, store, live = context.spec, context.store, context.live
    training_log = TrainingLog(live) if live is not None else None
    built = build_run(
        spec,
        context.data_root,
        resolved=context.resolved,
        show_progress=context.show_progress,
        plugins=[training_log] if training_log is not None else (),
    )
    stream, strategy = built.stream, built.strategy
    progress, status = _resume(spec, store, strategy, context.cfg_hash, context.force)
    if training_log is not None:
        training_log.first_step = progress.cost.train_steps or 0  # the steps of the tasks before a resume
    _learn_tasks(context, stream, strategy, progress)
    zero_shot = {
        target: _zero_shot(strategy, target, context.data_root, spec.limits)
        for target in spec.zero_shot_targets
    }
    result = _run_result(context, built.config, stream, strategy, progress, zero_shot)
    if context.save_model:  # next to the result: T<n>-seed<s>.model.safetensors + .model.json
        strategy.save_model(
            store.result_path(spec.key).with_suffix(".model"),
            extra={"run": str(spec.key), "config_hash": context.cfg_hash},
        )
    targets = np.asarray(stream.test_targets)
    predictions = Predictions(np.stack(progress.predictions), targets, np.arange(len(targets)))
    stored = store.save(spec.key, result, predictions)
    store.clear_checkpoint(spec.key)
    return stored.to_json(), status


def _resume(spec: RunSpec, store: ResultStore, strategy, cfg_hash: str, force: bool):
    """The run's progress and status: from its last checkpoint, loaded into ``strategy``, or new."""
    checkpoint = None if force else store.load_checkpoint(spec.key, cfg_hash)
    if checkpoint is None:
        return RunProgress(cost=RunCost(resumed_from=[])), "ran"
    progress, tensors, strategy_meta = checkpoint
    refusal = optional(strategy, "resume_refusal")
    why = (
        f"{spec.strategy} cannot resume from a checkpoint"
        if not optional(strategy, "resumable", True)  # state a checkpoint cannot hold: start again
        else refusal(strategy_meta)
        if refusal
        else None
    )
    if why:
        status = f"ran again from task 1 ({why})"
        warnings.warn(f"{spec.key}: {status}", stacklevel=2)  # the run's first line says so
        return RunProgress(cost=RunCost(resumed_from=[0])), status
    strategy.load_checkpoint_state(tensors, strategy_meta)
    progress.cost.resumed_from = [*(progress.cost.resumed_from or []), progress.tasks_done]
    status = f"resumed after task {progress.tasks_done}"
    warnings.warn(f"{spec.key}: {status}", stacklevel=2)
    return progress, status


def _learn_tasks(context: RunContext, stream, strategy, progress: RunProgress) -> None:
    """Learn the tasks not yet done, test after each, and checkpoint after each."""
    spec, store, live = context.spec, context.store, context.live
    eval_batch_size = context.resolved.strategy_cfg.eval_batch_size
    targets = np.asarray(stream.test_targets)
    cost = progress.cost
    steps_before = cost.train_steps or 0  # the training iterations of the tasks before a resume
    reset_peak_memory(spec.device)
    tasks = tqdm(
        range(progress.tasks_done, spec.n_tasks),
        desc=str(spec.key),
        leave=False,
        disable=not context.show_progress,
        initial=progress.tasks_done,
        total=spec.n_tasks,
    )
    for task in tasks:
        seed_everything(spec.seed, task)
        start = time.perf_counter()
        try:
            strategy.learn(stream.train_stream[task])
        except FloatingPointError as err:  # a diverging loss: a recipe problem, not a crash
            kept = f"the checkpoint after task {task} is kept" if task else "no task had finished"
            raise UserError(
                f"{spec.key}: task {task + 1}: {err}; {kept}. Lower the learning rate "
                "(or use --precision fp32) and rerun"
            ) from None
        train_seconds = time.perf_counter() - start
        cost.train_seconds += train_seconds
        iterations = optional(strategy, "train_iterations")
        cost.train_steps = None if iterations is None else steps_before + iterations

        start = time.perf_counter()
        try:  # checked against the contract before any metric: a wrong shape gives plausible numbers
            scores = evaluate(
                strategy, stream.test_set, eval_batch_size, spec.device, cache_key="test"
            ).numpy()
        except UserError as err:
            kept = f"the checkpoint after task {task} is kept" if task else "no task had finished"
            raise UserError(f"{spec.key}: task {task + 1}: {err}; no result is stored, {kept}") from None
        progress.predictions.append(predicted_classes(scores, strategy.seen_classes))
        metrics = stage_metrics(scores, strategy.seen_classes, targets, stream.task_of_class, task + 1)
        with torch.no_grad():
            stage_diagnostics = optional(strategy, "stage_diagnostics")
            diagnostics = (
                stage_diagnostics(scores, targets, stream.task_of_class) if stage_diagnostics else {}
            )
        stage = StageResult(task=task + 1, **metrics, diagnostics=diagnostics)
        eval_seconds = time.perf_counter() - start
        cost.eval_seconds += eval_seconds
        cost.peak_memory_bytes = max(cost.peak_memory_bytes, peak_memory(spec.device)[0])  # across resumes
        progress.stages.append(stage)
        if live is not None:
            live.stage(stage.to_json(), cost.train_steps)
        tasks.set_postfix(acc=f"{stage.acc:.1f}")
        store.save_checkpoint(spec.key, progress, *strategy.checkpoint_state(), context.cfg_hash)
        if context.task_lines:
            tqdm.write(
                f"{spec.key}: task {task + 1}/{spec.n_tasks}: acc {stage.acc:.2f} "
                f"(train {train_seconds:.0f} s, test {eval_seconds:.0f} s)",
                file=sys.stderr,
            )


def _run_result(
    context: RunContext, config: dict, stream, strategy, progress: RunProgress, zero_shot: dict
) -> RunResult:
    """The finished run's record (``benchmarks.runner.results.RunResult``)."""
    spec = context.spec
    memory, memory_kind = peak_memory(spec.device)
    stages = progress.stages
    return RunResult(
        schema_version=SCHEMA_VERSION,
        strategy=spec.strategy,
        label=spec.label,
        dataset=spec.dataset,
        n_tasks=spec.n_tasks,
        seed=spec.seed,
        config=config,
        config_hash=context.cfg_hash,
        class_order=stream.class_order,
        class_names=stream.class_names,
        tasks=stream.tasks,
        stages=stages,
        summary=summarize([stage.to_json() for stage in stages]),
        diagnostics=_no_grad(optional(strategy, "run_diagnostics", dict)),
        zero_shot=zero_shot or None,
        env=environment(spec.device, context.threads),
        cost=dataclasses.replace(
            progress.cost,
            trainable_params=_no_grad(optional(strategy, "trainable_parameter_count", lambda: None)),
            peak_memory_bytes=max(memory, progress.cost.peak_memory_bytes),
            peak_memory_kind=memory_kind,
            amp_skipped_steps=optional(strategy, "skipped_steps", 0),
        ),
    )


@torch.no_grad()
def _zero_shot(strategy, target: str, data_root: str, limits: RunLimits) -> dict:
    """Accuracy (%) of each of the strategy's zero-shot predictors on a target dataset's test split
    (``limits.zero_shot_images`` of it where set, spread over the classes).

    Images are transformed in the loader's workers; the target's text features are computed once.
    """
    data = _zero_shot_target(target, data_root)
    if limits.zero_shot_images is not None:
        every_class = {c: 0 for c in range(len(data.class_names))}
        data = data.subset(test=spread_indices(data.test_targets, every_class, limit=limits.zero_shot_images))
    backbone = strategy.backbone
    tokens = backbone.tokenize([strategy.cfg.prompt_template.format(n) for n in data.class_names])
    text = strategy.zero_shot_text(tokens)
    images = TransformedDataset(data.test, eval_transform(backbone.image_size, backbone.mean, backbone.std))
    hits: dict[str, torch.Tensor] = {}
    total = 0
    for batch, labels in tqdm(
        strategy.data_loader(images),
        desc=f"zero-shot {target}",
        leave=False,
        disable=not strategy.show_progress,
    ):
        labels = labels.to(strategy.device, non_blocking=True)
        predictions = strategy.zero_shot_predictions(batch.to(strategy.device, non_blocking=True), text)
        for name, value in predictions.items():
            count = (value == labels).sum() if name != "unknown" else value.sum()
            hits[name] = hits.get(name, 0) + count  # stays on the device until the end
        total += len(labels)
    out = {name: 100.0 * int(count) / total for name, count in hits.items() if name != "unknown"}
    if "unknown" in hits:
        out["unknown_rate"] = 100.0 * int(hits["unknown"]) / total
    return {**out, "n_test": total}


def _no_grad(function):
    with torch.no_grad():
        return function()
