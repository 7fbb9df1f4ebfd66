"""The learning side of a run, once it is built (``benchmarks.runner.building.build_run``): resume
from the last checkpoint, learn task after task, test and checkpoint after each, score the
zero-shot targets, and store the result with its predictions sidecar.

The strategy is read through the contract alone (``strategies.contract``): its ``Strategy``
protocol, and ``OptionalMembers`` (typed, each with its default) for everything else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from benchmarks.core.environment import Threads, environment, peak_memory, reset_peak_memory, seed_everything
from benchmarks.core.errors import UserError
from benchmarks.core.metrics import predicted_classes, stage_metrics, summarize
from benchmarks.data.streams import CILStream
from benchmarks.runner.building import BuiltRun, ResolvedRun
from benchmarks.runner.live_log import LiveLog, TrainingLog
from benchmarks.runner.result_record import SCHEMA_VERSION, RunCost, RunResult, StageResult
from benchmarks.runner.results import Predictions, ResultStore, RunProgress
from benchmarks.runner.run_spec import RunSpec
from benchmarks.runner.termination import stop_if_terminated
from benchmarks.runner.zero_shot import zero_shot_accuracy
from strategies.contract import OptionalMembers, Strategy, evaluate


@dataclass(frozen=True)
class RunContext:
    """One run under way: what computing it needs besides its stream and strategy."""

    resolved: ResolvedRun  # the run resolved once (benchmarks.runner.building): its config and hash
    store: ResultStore
    data_root: str
    force: bool = False
    show_progress: bool = True
    task_lines: bool = False
    save_model: bool = False
    live: LiveLog | None = None  # the run's live log (benchmarks.runner.live_log), if any
    threads: Threads = "auto"  # the run's thread setting (``set_threads``), recorded in its env

    @property
    def spec(self) -> RunSpec:
        """The run as the suite expanded it (``resolved.spec``)."""
        return self.resolved.spec


def training_log(context: RunContext, strategy_cls: type) -> TrainingLog | None:
    """The Avalanche plugin that writes each training iteration into the run's live log, for a
    strategy that runs Avalanche's loop; None without a live log. Any other strategy's live log
    holds its stages only, and the run warns so in one line rather than hand it a plugin it drops."""
    if context.live is None:
        return None
    if OptionalMembers(strategy_cls).avalanche_plugins:
        return TrainingLog(context.live)
    warnings.warn(
        f"{context.spec.key}: {context.spec.strategy} does not run Avalanche's loop, so its live log "
        "(--log) holds its stages, not its training iterations",
        stacklevel=2,
    )
    return None


def learn_and_store(
    context: RunContext, built: BuiltRun, log_plugin: TrainingLog | None = None
) -> tuple[RunResult, str]:
    """Train and evaluate one built run (``build_run``), resuming from its checkpoint; store the
    result with the run's resolved config. Returns the stored result and what happened.
    ``log_plugin``: the run's ``training_log``, attached to the strategy, whose steps go on after
    those of the tasks before a resume."""
    spec, store, stream, strategy = context.spec, context.store, built.stream, built.strategy
    progress, status = resume(spec, store, strategy, context.resolved.config_hash, context.force)
    if log_plugin is not None:
        log_plugin.first_step = progress.cost.train_steps or 0  # the steps of the tasks before a resume
    learn_tasks(context, stream, strategy, progress)
    zero_shot = {
        target: zero_shot_accuracy(
            strategy,
            built.backbone,
            target,
            context.data_root,
            limits=spec.limits,
            config=context.resolved.strategy_cfg,
            device=spec.device,
            show_progress=context.show_progress,
        )
        for target in spec.zero_shot_targets
    }
    result = run_result(context, stream, strategy, progress, zero_shot)
    # next to the result: T<n>-seed<s>.model.safetensors + .model.json (refused before the run
    # where the strategy has no save_model: execute._check_save_model)
    if context.save_model and (save_model := OptionalMembers(strategy).save_model) is not None:
        with writing(spec, "cannot write its model (--save-models)", _kept(spec.n_tasks)):
            save_model(
                store.result_path(spec.key).with_suffix(".model"),
                extra={"run": str(spec.key), "config_hash": context.resolved.config_hash},
            )
    targets = np.asarray(stream.test_targets)
    predictions = Predictions(np.stack(progress.predictions), targets, np.arange(len(targets)))
    stored = store.save(spec.key, result, predictions)
    store.clear_checkpoint(spec.key)
    return stored, status


def resume(
    spec: RunSpec, store: ResultStore, strategy: Strategy, cfg_hash: str, force: bool
) -> tuple[RunProgress, str]:
    """The run's progress and status: from its last checkpoint, loaded into ``strategy``, or new."""
    checkpoint = None if force else store.load_checkpoint(spec.key, cfg_hash)
    if checkpoint is None:
        return RunProgress(cost=RunCost(resumed_from=[])), "ran"
    progress, tensors, strategy_meta = checkpoint
    members = OptionalMembers(strategy)
    why = (
        f"{spec.strategy} cannot resume from a checkpoint"
        if not members.resumable  # state a checkpoint cannot hold: start again
        else members.resume_refusal(strategy_meta)
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


def learn_tasks(context: RunContext, stream: CILStream, strategy: Strategy, progress: RunProgress) -> None:
    """Learn the tasks not yet done, test after each, and checkpoint after each."""
    spec, live = context.spec, context.live
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
        stop_if_terminated()  # a SIGTERM whose Terminated a library swallowed: stop before the task
        seed_everything(spec.seed, task)
        start = time.perf_counter()
        try:
            strategy.learn(stream.train_stream[task])
        except FloatingPointError as err:  # a diverging loss: a recipe problem, not a crash
            raise UserError(
                f"{spec.key}: task {task + 1}: {err}; {_kept(task)}. Lower the learning rate "
                "(or use --precision fp32) and rerun"
            ) from None
        train_seconds = time.perf_counter() - start
        cost.train_seconds += train_seconds
        iterations = OptionalMembers(strategy).train_iterations
        cost.train_steps = None if iterations is None else steps_before + iterations

        start = time.perf_counter()
        try:  # checked against the contract before any metric: a wrong shape gives plausible numbers
            scores = evaluate(
                strategy, stream.test_set, eval_batch_size, spec.device, cache_key="test"
            ).numpy()
        except UserError as err:
            raise UserError(
                f"{spec.key}: task {task + 1}: {err}; no result is stored, {_kept(task)}"
            ) from None
        progress.predictions.append(predicted_classes(scores, strategy.seen_classes))
        metrics = stage_metrics(scores, strategy.seen_classes, targets, stream.task_of_class, task + 1)
        with torch.no_grad():
            diagnostics = OptionalMembers(strategy).stage_diagnostics(scores, targets, stream.task_of_class)
        validation = _validation_metrics(context, stream, strategy, task, scores, metrics)
        stage = StageResult(task=task + 1, **metrics, diagnostics=diagnostics, validation=validation)
        eval_seconds = time.perf_counter() - start
        cost.eval_seconds += eval_seconds
        cost.peak_memory_bytes = max(cost.peak_memory_bytes, peak_memory(spec.device)[0])  # across resumes
        progress.stages.append(stage)
        if live is not None:
            live.stage(stage.to_json(), cost.train_steps)
        tasks.set_postfix(acc=f"{stage.acc:.1f}")
        save_checkpoint(context, strategy, progress, task)
        if context.task_lines:
            tqdm.write(
                f"{spec.key}: task {task + 1}/{spec.n_tasks}: acc {stage.acc:.2f} "
                f"(train {train_seconds:.0f} s, test {eval_seconds:.0f} s)",
                file=sys.stderr,
            )


def save_checkpoint(context: RunContext, strategy: Strategy, progress: RunProgress, task: int) -> None:
    """The run's checkpoint after task ``task + 1`` (``writing``)."""
    with writing(context.spec, f"task {task + 1}: cannot write its checkpoint", _kept(task)):
        context.store.save_checkpoint(
            context.spec.key, progress, *strategy.checkpoint_state(), context.resolved.config_hash
        )


@contextlib.contextmanager
def writing(spec: RunSpec, failure: str, kept: str) -> Iterator[None]:
    """A strategy's state written in the block: an exception is one line naming the run, ``failure``
    and what is ``kept``; a full disk stays an ``OSError``, which the command words itself."""
    try:
        yield
    except (UserError, OSError):
        raise
    except Exception as err:
        message = str(err).splitlines()[0] if str(err) else ""
        raise UserError(
            f"{spec.key}: {failure} ({type(err).__name__}: {message}); no result is stored, {kept}"
        ) from err


def _validation_metrics(
    context: RunContext, stream: CILStream, strategy: Strategy, task: int, test_scores, test_metrics: dict
) -> dict | None:
    """The stage's metrics on the validation split, by the code that gives its test metrics; None
    without a split. A tuning run's test set is its validation set: scored once."""
    if stream.validation_set is None:
        return None
    if stream.validation_set is stream.test_set:
        return dict(test_metrics)
    try:
        scores = evaluate(
            strategy,
            stream.validation_set,
            context.resolved.strategy_cfg.eval_batch_size,
            context.spec.device,
            cache_key="validation",
        ).numpy()
    except UserError as err:
        raise UserError(
            f"{context.spec.key}: task {task + 1}: {err}; no result is stored, {_kept(task)}"
        ) from None
    targets = np.asarray(stream.validation_targets)
    return stage_metrics(scores, strategy.seen_classes, targets, stream.task_of_class, task + 1)


def validation_summary(stages: list[StageResult]) -> dict | None:
    """``summarize`` of the stages' validation metrics (what a tune's objective reads); None without."""
    validations = [stage.validation for stage in stages if stage.validation is not None]
    if not stages or len(validations) < len(stages):
        return None
    return summarize(validations)


def _kept(task: int) -> str:
    """What a run that fails in task ``task + 1`` keeps."""
    return f"the checkpoint after task {task} is kept" if task else "no task had finished"


def run_result(
    context: RunContext, stream: CILStream, strategy: Strategy, progress: RunProgress, zero_shot: dict
) -> RunResult:
    """The finished run's record (``benchmarks.runner.results.RunResult``), with its resolved config."""
    spec, resolved = context.spec, context.resolved
    memory, memory_kind = peak_memory(spec.device)
    stages = progress.stages
    optional = OptionalMembers(strategy)
    return RunResult(
        schema_version=SCHEMA_VERSION,
        strategy=spec.strategy,
        label=spec.label,
        dataset=spec.dataset,
        n_tasks=spec.n_tasks,
        seed=spec.seed,
        config=resolved.config,
        config_hash=resolved.config_hash,
        class_order=stream.class_order,
        class_names=stream.class_names,
        tasks=stream.tasks,
        stages=stages,
        summary=summarize([stage.to_json() for stage in stages]),
        validation_summary=validation_summary(stages),
        diagnostics=_no_grad(optional.run_diagnostics),
        zero_shot=zero_shot or None,
        env=environment(spec.device, context.threads),
        cost=dataclasses.replace(
            progress.cost,
            trainable_params=_no_grad(optional.trainable_parameter_count),
            peak_memory_bytes=max(memory, progress.cost.peak_memory_bytes),
            peak_memory_kind=memory_kind,
            amp_skipped_steps=optional.skipped_steps,
        ),
    )


def _no_grad(function):
    with torch.no_grad():
        return function()
