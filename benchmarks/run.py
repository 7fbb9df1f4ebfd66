"""Run a suite: ``python -m benchmarks.run --suite smoke``.

Each run (strategy or variant, dataset, task count, seed) trains task after task, evaluates every
stage from the strategy's scores, checkpoints after every task, and writes one result JSON.
Finished runs with the same resolved config are skipped; killed runs resume from their last
finished task, with the loss scaler's state, so a resumed run ends with the same numbers.
Mistakes in the command line or the environment print one line and exit with 2.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import json
import multiprocessing
import re
import sys
import time
import warnings
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from tqdm.auto import tqdm

from analysis.metrics import predicted_classes, stage_metrics, summarize
from benchmarks.backbone import BackboneSpec, check_weights, create_clip, recorded_backbone
from benchmarks.class_orders import resolve_class_order
from benchmarks.datasets import TransformedDataset, load_dataset, load_zero_shot_target
from benchmarks.environment import environment, peak_memory, reset_peak_memory, seed_everything, set_deterministic
from benchmarks.errors import UserError, one_line_user_errors
from benchmarks.launchers import LAUNCHERS, check_gpus, launch_local, run_log
from benchmarks.locking import read_holder
from benchmarks.precision import PRECISIONS, resolve_precision
from benchmarks.results import (CHECKPOINT_STATE, SCHEMA_VERSION, Predictions, ResultStore, RunKey, config_hash,
                                iter_results, write_json, write_tensors)
from benchmarks.status import run_state
from benchmarks.streams import build_stream, split_classes
from benchmarks.suites import RunSpec, dataset_loader_options, expand, load_suite
from benchmarks.transforms import eval_transform, train_transform
from strategies.registry import get_strategy



@lru_cache(maxsize=4)
def _dataset(name: str, data_root: str, options: tuple):
    return load_dataset(name, data_root, **dict(options))


@lru_cache(maxsize=4)
def _zero_shot_target(name: str, data_root: str):
    return load_zero_shot_target(name, data_root)


def dry_run_table(runs: list[RunSpec], store: ResultStore, data_root: str) -> str:
    """One row per run of the suite: its state in ``store`` and an estimate of what is left to
    compute, from the ``cost`` of finished runs of the same strategy and dataset (mean train +
    evaluation seconds a task, times the tasks left)."""
    per_task: dict[tuple[str, str], list[float]] = {}
    for _, result in iter_results(store.root, skipped=[]):
        cost = result.get("cost") or {}
        if "train_seconds" in cost:
            seconds = (cost["train_seconds"] + cost.get("eval_seconds", 0.0)) / result["n_tasks"]
            per_task.setdefault((result["strategy"], result["dataset"]), []).append(seconds)
    lines = ["| run | state | estimated cost left |", "|---|---|---|"]
    total, unknown = 0.0, 0
    for spec in runs:
        _, _, config = resolve(spec, data_root)
        state = run_state(store, spec.key, config_hash(config))
        left = 0 if state.state in ("finished", "running") else spec.n_tasks - state.tasks_done
        estimate = "-"
        if left:
            samples = per_task.get((spec.strategy, spec.dataset))
            if samples:
                seconds = left * sum(samples) / len(samples)
                total += seconds
                estimate = _duration(seconds)
            else:
                unknown += 1
                estimate = "no finished run of this strategy and dataset yet"
        detail = f" ({state.detail})" if state.detail else ""
        lines.append(f"| {spec.key} | {state.state}{detail} | {estimate} |")
    lines += ["", f"{len(runs)} run(s); estimated {_duration(total)} left"
                  + (f", plus {unknown} run(s) without an estimate" if unknown else "")]
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def _load_data(spec: RunSpec, data_root: str):
    options = dataset_loader_options(spec.dataset_options)
    return _dataset(spec.dataset, data_root, tuple(sorted(options.items())))


def resolve(spec: RunSpec, data_root: str) -> tuple[type, object, dict]:
    """The strategy class, its config, and the fully resolved run config (hashed for caching).

    Options come from the suite's tables, most specific first (``benchmarks.suites``), then the
    strategy's defaults; ``config.option_sources`` records where each field's value came from
    (not hashed: it names a cause, not a value). Precision "auto" resolves with the strategy's
    ``amp`` (fp32 for a method that is fp32 officially)."""
    strategy_cls = get_strategy(spec.strategy)
    try:
        strategy_cfg = strategy_cls.Config.from_dict(dict(spec.strategy_options), spec.strategy)
    except UserError as err:
        named = {k for k in spec.option_sources if re.search(rf"\b{k}\s*=|'{k}'", str(err))}
        where = sorted({f"[{spec.option_sources[k]}]" for k in named})
        raise UserError(f"{err} (set in {', '.join(where)})" if where else str(err)) from None
    precision = resolve_precision(spec.precision, spec.device, strategy_cfg.amp)
    sources = {name: spec.option_sources.get(name, "default") for name in strategy_cfg.to_dict()}
    if spec.epoch_scale != 1.0 and isinstance(strategy_cfg.epochs, int) and strategy_cfg.epochs > 0:
        scaled = max(1, round(strategy_cfg.epochs * spec.epoch_scale))
        strategy_cfg = dataclasses.replace(strategy_cfg, epochs=scaled)
        sources["epochs"] += f" x epoch_scale {spec.epoch_scale:g}"
    config = {**spec.config, "backbone": recorded_backbone(spec.config["backbone"]), "precision": precision,
              "strategy_config": strategy_cfg.to_dict(), "option_sources": sources}
    return strategy_cls, strategy_cfg, config


def _backbone_spec(spec: RunSpec) -> BackboneSpec:
    return BackboneSpec(model=spec.backbone["model"], pretrained=spec.backbone["pretrained"])


def preflight(runs: list[RunSpec], data_root: str) -> None:
    """Check every run's strategy, options, data, class order, task count and weights up front,
    so that a mistake stops the suite before any long work instead of in the middle of it."""
    for spec in runs:
        resolve(spec, data_root)
        data = _load_data(spec, data_root)
        order = resolve_class_order(spec.class_order, len(data.class_names), spec.dataset)
        split_classes(order, spec.n_tasks, spec.dataset)
        for target in spec.zero_shot_targets:
            strategy_cls = get_strategy(spec.strategy)
            if not all(hasattr(strategy_cls, m) for m in ("zero_shot_text", "zero_shot_predictions")):
                raise UserError(f"strategy {spec.strategy} has no zero-shot predictor; drop zero_shot_targets "
                                "from the suite or run a strategy that has one (gr4cil)")
            _zero_shot_target(target, data_root)
    for backbone in {_backbone_spec(spec) for spec in runs}:
        check_weights(backbone)


PREDICTIONS_KEY = "runner/predictions"  # the per-image predictions so far, inside a checkpoint's tensors


def _save_checkpoint(directory: Path, task: int, strategy, stages: list, cost: dict, cfg_hash: str,
                     predictions: list[np.ndarray]) -> None:
    """Tensors (the strategy's and the predictions so far) go to ``task-NN.safetensors``;
    ``state.json`` is written last and names that file, so a run killed at any moment leaves the
    previous complete checkpoint in place."""
    for attempt in range(3):  # another runner may remove an empty parent folder meanwhile
        try:
            directory.mkdir(parents=True, exist_ok=True)
            break
        except FileNotFoundError:
            if attempt == 2:
                raise
    tensors, meta = strategy.checkpoint_state()
    tensors = {**tensors, PREDICTIONS_KEY: torch.from_numpy(np.stack(predictions).astype(np.int32))}
    tensor_file = f"task-{task:02d}.safetensors"
    write_tensors(directory / tensor_file, tensors)
    write_json(directory / CHECKPOINT_STATE, {"config_hash": cfg_hash, "tasks_done": task,
                                              "tensor_file": tensor_file, "strategy": meta,
                                              "stages": stages, "cost": cost})
    for old in directory.glob("task-*.safetensors"):
        if old.name != tensor_file:
            old.unlink()


def _load_checkpoint(directory: Path, cfg_hash: str, key: RunKey | None = None):
    """The run's last checkpoint (state, tensors), or None to start the run over: none exists, the
    config changed, or the files are damaged (a full disk, a lost network write), which is said."""
    state_path = directory / CHECKPOINT_STATE
    if not state_path.exists():
        return None
    try:
        state = json.loads(state_path.read_text())
        if state.get("config_hash") != cfg_hash:
            return None  # the config changed: start over
        return state, load_file(str(directory / state["tensor_file"]))
    except (OSError, ValueError, KeyError, SafetensorError) as err:  # JSONDecodeError is a ValueError
        warnings.warn(f"{key or directory}: its checkpoint in {directory} is damaged "
                      f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'unreadable'}); "
                      "starting the run over", stacklevel=2)
        return None


def execute(spec: RunSpec, store: ResultStore, data_root: str, *, force: bool = False,
            show_progress: bool = True, save_model: bool = False) -> tuple[dict | None, str]:
    """Run (or resume, or skip) one run under its lock. Returns its result and what happened; the
    result is None when another process holds the run's lock."""
    strategy_cls, strategy_cfg, config = resolve(spec, data_root)
    cfg_hash = config_hash(config)
    if not force and (done := store.finished(spec.key, cfg_hash)) is not None:
        return done, "cached"
    lock = store.lock(spec.key)
    if not lock.acquire():
        holder = read_holder(lock.path)
        return None, f"skipped, running elsewhere ({holder.describe() if holder else 'locked'})"
    try:
        if not force and (done := store.finished(spec.key, cfg_hash)) is not None:
            result, status = done, "cached (finished by another process)"
        else:
            result, status = _compute(spec, store, data_root, strategy_cls, strategy_cfg, config, cfg_hash,
                                      force=force, show_progress=show_progress, save_model=save_model)
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


def _compute(spec: RunSpec, store: ResultStore, data_root: str, strategy_cls, strategy_cfg, config: dict,
             cfg_hash: str, *, force: bool, show_progress: bool, save_model: bool) -> tuple[dict, str]:
    """Train and evaluate one run, resuming from its checkpoint; store the result."""

    data = _load_data(spec, data_root)
    class_order = resolve_class_order(spec.class_order, len(data.class_names), spec.dataset)
    set_deterministic(spec.deterministic)
    seed_everything(spec.seed, -1)  # a randomly initialised backbone is the same on every (re)run
    backbone = create_clip(_backbone_spec(spec), spec.device)
    stream = build_stream(data, spec.n_tasks, class_order,
                          train_transform(backbone.image_size, backbone.mean, backbone.std, strategy_cfg.train_augmentation),
                          eval_transform(backbone.image_size, backbone.mean, backbone.std))
    strategy = strategy_cls(backbone=backbone, class_names=stream.class_names, config=strategy_cfg,
                            device=spec.device, precision=spec.precision, show_progress=show_progress, seed=spec.seed)
    targets = np.asarray(stream.test_targets)

    checkpoint_dir = store.checkpoint_dir(spec.key)
    stages: list[dict] = []
    cost = {"train_seconds": 0.0, "eval_seconds": 0.0, "peak_memory_bytes": 0}
    status = "ran"
    predictions: list[np.ndarray] = []  # per stage: the predicted class of every test image
    checkpoint = None if force else _load_checkpoint(checkpoint_dir, cfg_hash, spec.key)
    if checkpoint is not None and PREDICTIONS_KEY not in checkpoint[1]:
        checkpoint = None  # written before predictions were stored: start over to have them
    if checkpoint is not None:
        state, tensors = checkpoint
        predictions = list(tensors.pop(PREDICTIONS_KEY).numpy().astype(np.int64))
        strategy.load_checkpoint_state(tensors, state["strategy"])
        stages, cost = state["stages"], state["cost"]
        status = f"resumed after task {state['tasks_done']}"
    reset_peak_memory(spec.device)

    tasks = tqdm(range(len(stages), spec.n_tasks), desc=str(spec.key), leave=False,
                 disable=not show_progress, initial=len(stages), total=spec.n_tasks)
    for task in tasks:
        seed_everything(spec.seed, task)
        start = time.perf_counter()
        try:
            strategy.learn(stream.train_stream[task])
        except FloatingPointError as err:  # a diverging loss: a recipe problem, not a crash
            kept = f"the checkpoint after task {task} is kept" if task else "no task had finished"
            raise UserError(f"{spec.key}: task {task + 1}: {err}; {kept}. Lower the learning rate "
                            "(or use --precision fp32) and rerun") from None
        cost["train_seconds"] += time.perf_counter() - start

        start = time.perf_counter()
        scores = strategy.score_dataset(stream.test_set, cache_key="test").numpy()
        predictions.append(predicted_classes(scores, strategy.seen_classes))
        stage = {"task": task + 1, **stage_metrics(scores, strategy.seen_classes, targets,
                                                   stream.task_of_class, task + 1)}
        with torch.no_grad():
            stage["diagnostics"] = strategy.stage_diagnostics(scores, targets, stream.task_of_class)
        cost["eval_seconds"] += time.perf_counter() - start
        cost["peak_memory_bytes"] = max(cost["peak_memory_bytes"], peak_memory(spec.device)[0])  # across resumes
        stages.append(stage)
        tasks.set_postfix(acc=f"{stage['acc']:.1f}")
        _save_checkpoint(checkpoint_dir, task + 1, strategy, stages, cost, cfg_hash, predictions)

    zero_shot = {target: _zero_shot(strategy, target, data_root) for target in spec.zero_shot_targets}
    memory, memory_kind = peak_memory(spec.device)
    result = {
        "schema_version": SCHEMA_VERSION,
        "strategy": spec.strategy, "label": spec.label, "dataset": spec.dataset,
        "n_tasks": spec.n_tasks, "seed": spec.seed,
        "config": config, "config_hash": cfg_hash,
        "class_order": stream.class_order, "class_names": stream.class_names, "tasks": stream.tasks,
        "stages": stages, "summary": summarize(stages),
        "diagnostics": _no_grad(strategy.run_diagnostics),
        **({"zero_shot": zero_shot} if zero_shot else {}),
        "env": environment(spec.device),
        "cost": {**cost, "trainable_params": strategy.trainable_parameter_count(),
                 "peak_memory_bytes": max(memory, cost["peak_memory_bytes"]), "peak_memory_kind": memory_kind,
                 "amp_skipped_steps": strategy.skipped_steps},
    }
    if save_model:  # next to the result: T<n>-seed<s>.model.safetensors + .model.json
        strategy.save_model(store.result_path(spec.key).with_suffix(".model"),
                            extra={"run": str(spec.key), "config_hash": cfg_hash})
    store.save(spec.key, result, Predictions(np.stack(predictions), targets, np.arange(len(targets))))
    store.clear_checkpoint(spec.key)
    return result, status


@torch.no_grad()
def _zero_shot(strategy, target: str, data_root: str) -> dict:
    """Accuracy (%) of each of the strategy's zero-shot predictors on a target dataset's test split.

    Images are transformed in the loader's workers; the target's text features are computed once.
    """
    data = _zero_shot_target(target, data_root)
    backbone = strategy.backbone
    tokens = backbone.tokenize([strategy.cfg.prompt_template.format(n) for n in data.class_names])
    text = strategy.zero_shot_text(tokens)
    images = TransformedDataset(data.test, eval_transform(backbone.image_size, backbone.mean, backbone.std))
    hits: dict[str, torch.Tensor] = {}
    total = 0
    for batch, labels in tqdm(strategy.data_loader(images), desc=f"zero-shot {target}", leave=False,
                              disable=not strategy.show_progress):
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


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, no usage dump
        self.exit(2, f"error: {message}; see python -m benchmarks.run --help\n")


def _csv(kind):
    def parse(text: str):
        try:
            return [kind(item) for item in text.split(",") if item]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _Parser(prog="python -m benchmarks.run", description=__doc__.split("\n")[0])
    parser.add_argument("--suite", default="smoke", help="suite name (benchmarks/suites/NAME.toml) or a .toml path")
    parser.add_argument("--strategies", type=_csv(str), help="comma-separated strategies or variant labels")
    parser.add_argument("--datasets", type=_csv(str), help="comma-separated dataset names")
    parser.add_argument("--tasks", type=_csv(int), help="comma-separated task counts, e.g. 5,10,20")
    parser.add_argument("--seeds", type=_csv(int), help="comma-separated seeds")
    parser.add_argument("--results-dir", help="where result JSON goes (default: runs/SUITE)")
    parser.add_argument("--data-root", default="data", help="folder holding the datasets (default: ./data)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], help="default: the suite's, else auto")
    parser.add_argument("--precision", choices=["auto", *PRECISIONS],
                        help="fp32, fp16 (autocast + loss scaling) or bf16; default: the suite's, else auto "
                             "(fp16 on CUDA, fp32 on CPU)")
    parser.add_argument("--deterministic", action="store_true",
                        help="deterministic CUDA kernels (torch.use_deterministic_algorithms): bit-identical GPU "
                             "reruns, somewhat slower; CPU runs are bit-identical without it")
    parser.add_argument("--weights", help="local CLIP weight file (overrides the suite's pretrained tag)")
    parser.add_argument("--class-order", help="seed1993 (default), seedN, or dytox (CIFAR-100)")
    parser.add_argument("--force", action="store_true", help="recompute finished runs")
    parser.add_argument("--save-models", action="store_true",
                        help="also save each finished run's learned state (safetensors + JSON) next to its result")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="inline",
                        help="inline: runs one after another here (default); local: --workers processes on this "
                             "machine, sharing the runs through their locks; slurm: one SLURM job per unfinished "
                             "run, as a job array (submitit)")
    parser.add_argument("--workers", type=int, default=1, help="local launcher: worker processes (default 1)")
    parser.add_argument("--gpus", type=_csv(int), help="local launcher: GPU ids, worker i gets gpus[i %% len]")
    slurm = parser.add_argument_group("slurm launcher (override the suite's [launcher] table)")
    slurm.add_argument("--slurm-partition", help="partition")
    slurm.add_argument("--slurm-time", type=int, help="time limit of a job, minutes (default 1440); a job that "
                       "reaches it is requeued and resumes")
    slurm.add_argument("--slurm-gpus", type=int, help="GPUs per job (default 1)")
    slurm.add_argument("--slurm-cpus", type=int, help="CPUs per job (default 8)")
    slurm.add_argument("--slurm-mem-gb", type=float, help="memory per job, GB (default: the partition's)")
    slurm.add_argument("--slurm-array-parallelism", type=int, help="jobs of the array running at once (default 64)")
    slurm.add_argument("--slurm-account", help="account to charge")
    slurm.add_argument("--slurm-qos", help="quality of service")
    slurm.add_argument("--slurm-constraint", help="node constraint, e.g. a100")
    slurm.add_argument("--slurm-setup", action="append", metavar="LINE",
                       help="a shell line run before each job, e.g. 'module load cuda' (repeatable)")
    parser.add_argument("--no-wait", action="store_true",
                        help="slurm launcher: exit once submitted; rerun the same command to collect the results "
                             "(nothing is submitted twice)")
    parser.add_argument("--run-logs", action="store_true", help=argparse.SUPPRESS)  # set by the local launcher
    parser.add_argument("--dry-run", action="store_true",
                        help="list every run with its state (finished, partial, running, to run) and an estimated "
                             "cost from finished runs of the same strategy and dataset; run nothing")
    return parser.parse_args(argv)


def _check_launcher_options(args: argparse.Namespace, suite: dict):
    """Reject options that do not belong to the chosen launcher; the SLURM options, resolved
    (suite ``[launcher]`` table, then the command line), for ``--launcher slurm``."""
    slurm_given = {name.removeprefix("slurm_"): value for name, value in vars(args).items()
                   if name.startswith("slurm_")}
    if args.launcher != "slurm" and (any(v is not None for v in slurm_given.values()) or args.no_wait):
        raise UserError("--slurm-* options and --no-wait belong to --launcher slurm")
    if args.launcher != "local" and (args.workers != 1 or args.gpus):
        raise UserError("--workers and --gpus belong to --launcher local")
    if args.launcher == "local":
        if args.workers < 1:
            raise UserError(f"--workers must be at least 1, not {args.workers}")
        check_gpus(args.gpus)
    if args.launcher != "inline" and args.force:
        raise UserError(f"--force with --launcher {args.launcher} could recompute a run that another process "
                        "holds; delete the results to recompute, or use --force with the inline launcher")
    if args.launcher != "slurm":
        return None
    from benchmarks.slurm import SlurmOptions, check_slurm

    options = SlurmOptions.resolve(suite.get("launcher", {}), slurm_given)
    if not args.dry_run:
        check_slurm()
    return options


def _slurm_job_argv(args: argparse.Namespace, device: str, store: ResultStore):
    """A run's command line inside its SLURM job: the inline runner, restricted to that run, with
    every path absolute (the job may start in another folder) and the device fixed."""
    suite = Path(args.suite)
    base = ["--suite", str(suite.resolve()) if suite.suffix == ".toml" and suite.exists() else args.suite,
            "--results-dir", str(store.root.resolve()), "--data-root", str(Path(args.data_root).resolve()),
            "--device", device, "--launcher", "inline", "--quiet", "--run-logs"]
    if args.precision:
        base += ["--precision", args.precision]
    if args.deterministic:
        base.append("--deterministic")
    if args.weights:
        base += ["--weights", str(Path(args.weights).resolve()) if Path(args.weights).exists() else args.weights]
    if args.class_order:
        base += ["--class-order", args.class_order]
    if args.save_models:
        base.append("--save-models")

    def for_run(spec: RunSpec) -> list[str]:
        return [*base, "--strategies", spec.label, "--datasets", spec.dataset, "--tasks", str(spec.n_tasks),
                "--seeds", str(spec.seed)]

    return for_run


# A full disk or quota, or a folder the user may not write: the machine's problem, not a bug.
_STORAGE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS}


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    return f"warning: {message}\n"


@one_line_user_errors
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.formatwarning = _one_line_warning  # a notice for the user, not a source location
    # Under forkserver (Linux's default from Python 3.14) loader workers fork from a server that has
    # imported the suite once, instead of importing torch and Avalanche (seconds) in every worker.
    multiprocessing.set_forkserver_preload(["benchmarks.run"])
    try:
        suite = load_suite(args.suite)
        slurm_options = _check_launcher_options(args, suite)  # bad launcher input: one line, before anything runs
        device = args.device
        if slurm_options is not None and (device or suite.get("device", "auto")) == "auto":
            device = "cuda" if slurm_options.gpus else "cpu"  # the jobs' device, not this login node's
        runs = expand(suite, strategies=args.strategies, datasets=args.datasets, tasks=args.tasks,
                      seeds=args.seeds, device=device, class_order=args.class_order,
                      weights=args.weights, precision=args.precision,
                      deterministic=args.deterministic or None, check_device=slurm_options is None)
        if any(spec.deterministic for spec in runs) and slurm_options is None:
            set_deterministic(True)  # before any CUDA work: cuBLAS reads its workspace setting once
        results_dir = Path(args.results_dir or Path("runs") / suite["name"])
        store = ResultStore(results_dir)
        if args.dry_run:
            print(dry_run_table(runs, store, args.data_root))
            return 0
        preflight(runs, args.data_root)
        print(f"suite {suite['name']}: {len(runs)} run(s) -> {results_dir}", file=sys.stderr)
        if args.launcher in ("local", "slurm"):
            hashes = {spec.key: config_hash(resolve(spec, args.data_root)[2]) for spec in runs}
            if args.launcher == "local":
                code, finished = launch_local(sys.argv[1:] if argv is None else list(argv), args.workers,
                                              args.gpus, runs, store, hashes, args.quiet)
            else:
                from benchmarks.slurm import launch_slurm

                code, finished = launch_slurm(runs, store, hashes, _slurm_job_argv(args, runs[0].device, store),
                                              slurm_options, f"cil-{suite['name']}", not args.no_wait, args.quiet)
                if args.no_wait and len(finished) < len(runs):
                    return code
            if finished:
                from analysis.tables import write_tables

                print(write_tables(results_dir, finished))
            if code:
                print(f"error: {len(runs) - len(finished)} of {len(runs)} run(s) did not finish; see "
                      f"python -m benchmarks.status --results-dir {results_dir}", file=sys.stderr)
            return code
        finished = []
        for spec in tqdm(runs, desc=f"suite {suite['name']}", disable=args.quiet):
            with run_log(store, spec.key) if args.run_logs else contextlib.nullcontext():
                result, status = execute(spec, store, args.data_root, force=args.force,
                                         show_progress=not args.quiet, save_model=args.save_models)
                if result is not None:
                    summary = result["summary"]
                    status += f"; Avg {summary['avg_acc']:.2f}  Last {summary['last_acc']:.2f}"
                if args.run_logs:  # the run's own log tells its story too
                    print(f"{spec.key}: {status}", file=sys.stderr)
            tqdm.write(f"{spec.key}: {status}", file=sys.stderr)
            if result is not None:  # None: another process holds the run
                finished.append(spec.key)
        from analysis.tables import write_tables

        if finished:
            print(write_tables(results_dir, finished))
        else:
            print("no run finished here: every run is held by another process; rerun later to collect them",
                  file=sys.stderr)
    except OSError as err:
        if err.errno not in _STORAGE_ERRORS:
            raise
        where = f" ({err.filename})" if err.filename else ""
        print(f"error: cannot write the results{where}: {err.strerror}; free space or fix permissions (or give "
              "another --results-dir) and rerun: finished tasks are kept", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: rerun the same command to resume from the last finished task", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
