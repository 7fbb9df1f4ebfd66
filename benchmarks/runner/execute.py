"""Execute one run: train task after task, evaluate every stage from the strategy's scores,
checkpoint after every task, and store the result JSON with its predictions sidecar (once the run
is built, ``benchmarks.runner.learning`` does all that).

Finished runs with the same resolved config are skipped; killed runs resume from their last
finished task, with the loss scaler's state, so a resumed run ends with the same numbers. A stored
result is never replaced unsaid (``ResultStore.refusal``, checked in ``preflight`` for every run
before any computes), and each stage's scores are checked against the contract before any metric. Every
launcher (``benchmarks.runner.launcher``) ends up here, in this process or in a worker or job.
"""

from __future__ import annotations

import contextlib

from benchmarks.backbone.weights import check_weights  # offline: preflight needs no open_clip
from benchmarks.core.environment import Threads
from benchmarks.core.errors import UserError
from benchmarks.core.heartbeat_lock import read_holder
from benchmarks.data.class_orders import resolve_class_order
from benchmarks.data.splits import split_classes
from benchmarks.runner.building import ResolvedRun, backbone_spec, build_run, load_run_data, resolve
from benchmarks.runner.learning import RunContext, learn_and_store, training_log
from benchmarks.runner.live_log import LiveLog
from benchmarks.runner.result_record import RunResult
from benchmarks.runner.results import ResultStore, reused_status, safe_label
from benchmarks.runner.run_spec import RunSpec
from benchmarks.runner.zero_shot import zero_shot_target


def preflight(
    runs: list[RunSpec],
    data_root: str,
    *,
    store: ResultStore | None = None,
    force: bool = False,
    save_models: bool = False,
) -> list[ResolvedRun]:
    """Check every run's strategy, options, data, class order, task count and weights up front,
    so that a mistake stops the suite before any long work instead of in the middle of it. With
    ``store``: no run may replace a stored result unsaid (``ResultStore.refusal``: a newer schema,
    another label sharing the folder, another config without ``force``); with ``save_models``:
    every run's strategy can save its model. Returns the runs resolved, in order: what the
    launchers and ``execute`` take, so no run is resolved twice."""
    folders: dict[tuple[str, str], str] = {}
    for spec in runs:  # two labels, one folder (a:b and a_b): each run would overwrite the other
        folder = safe_label(spec.label)
        if (other := folders.setdefault((spec.dataset, folder), spec.label)) != spec.label:
            raise UserError(
                f"runs {other!r} and {spec.label!r} would share the result folder {folder!r}; "
                "rename one of the variants"
            )
    resolved_runs = []
    for spec in runs:
        resolved = resolve(spec, data_root)
        resolved_runs.append(resolved)
        if save_models:
            _check_save_model(resolved)
        if store is not None:  # before any run computes, not when the run comes up
            _refuse_replacing(store, resolved, force)
        data = load_run_data(spec, data_root)
        order = resolve_class_order(spec.class_order, len(data.class_names), spec.dataset)
        split_classes(order, spec.tasks, spec.dataset)
        zero_shot = ("zero_shot_text", "zero_shot_predictions")
        if spec.zero_shot_targets and not all(hasattr(resolved.strategy_cls, m) for m in zero_shot):
            raise UserError(
                f"strategy {spec.strategy} has no zero-shot predictor; drop zero_shot_targets "
                "from the suite or run a strategy that has one (gr4cil)"
            )
        for target in spec.zero_shot_targets:
            zero_shot_target(target, data_root)
    for backbone in {backbone_spec(spec) for spec in runs}:
        check_weights(backbone)
    return resolved_runs


def execute(
    resolved: ResolvedRun,
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
    reuse_from: tuple[str, ...] = (),
) -> tuple[RunResult | None, str]:
    """Run (or resume, or skip) one run (``resolved``: as ``preflight`` returns it) under its lock.
    Returns its result and what happened; the result is None when another process holds the run's
    lock. ``show_progress``: progress bars;
    ``task_lines``: one line on stderr per finished task instead (a log that is not a terminal);
    ``log``: the live logs to write (``benchmarks.runner.live_log``), ``project`` naming the W&B
    project; ``threads``: the setting the caller gave ``set_threads``, recorded in the result;
    ``reuse_from``: other results folders whose finished result of this config is copied here
    instead of computed (``ResultStore.reuse``; not with ``force`` or ``save_model``)."""
    spec, cfg_hash = resolved.spec, resolved.config_hash
    _refuse_replacing(store, resolved, force)
    if not force and (done := store.finished(spec.key, cfg_hash)) is not None:
        return done, "cached"
    if save_model:
        _check_save_model(resolved)
    lock = store.lock(spec.key)
    held = False
    try:  # from the acquisition on: a SIGTERM landing as it returns still releases the lock
        held = lock.acquire()
        if not held:
            holder = read_holder(lock.path)
            return None, f"skipped, running elsewhere ({holder.describe() if holder else 'locked'})"
        _refuse_replacing(store, resolved, force)  # another process may have stored it
        if not force and (done := store.finished(spec.key, cfg_hash)) is not None:
            result, status = done, "cached (finished by another process)"
        elif not (force or save_model) and (found := store.reuse(spec.key, cfg_hash, reuse_from)):
            result, status = found[0], reused_status(found[1])
        else:
            live = LiveLog(log, store.root, spec.key, {**resolved.config, "suite": project}) if log else None
            with live or contextlib.nullcontext():
                context = RunContext(
                    resolved,
                    store,
                    data_root,
                    force=force,
                    show_progress=show_progress,
                    task_lines=task_lines,
                    save_model=save_model,
                    live=live,
                    threads=threads,
                )
                result, status = _compute(context)
    except (KeyboardInterrupt, SystemExit):  # stopped, not failed (SLURM's requeue exits this way)
        lock.release()  # removes the lock file only where this process wrote it
        raise
    except BaseException as err:  # a user error says it all; anything else is named
        if held:
            message = str(err) if isinstance(err, UserError) else f"{type(err).__name__}: {err}"
            lock.release(error=message.splitlines()[0] if message else type(err).__name__)
        raise
    lock.release(finished=True)
    if lock.took_over is not None:
        status += f"; took over a stale lock of {lock.took_over.describe()}"
    return result, status


def _refuse_replacing(store: ResultStore, resolved: ResolvedRun, force: bool) -> None:
    """One line, and no run, where computing the run would replace its stored result unsaid."""
    key = resolved.spec.key
    if (why := store.refusal(key, resolved.config_hash, force, resolved.config)) is not None:
        raise UserError(why)


def _check_save_model(resolved: ResolvedRun) -> None:
    if not hasattr(resolved.strategy_cls, "save_model"):
        raise UserError(
            f"{resolved.spec.strategy} has no save_model, so --save-models cannot keep its model; "
            "drop the flag"
        )


def _compute(context: RunContext) -> tuple[RunResult, str]:
    """Build the run (``build_run``) with the live log's plugin where it can take one, then learn,
    evaluate and store it (``benchmarks.runner.learning``)."""
    log_plugin = training_log(context, context.resolved.strategy_cls)
    built = build_run(
        context.resolved,
        context.data_root,
        show_progress=context.show_progress,
        plugins=[log_plugin] if log_plugin is not None else (),
    )
    return learn_and_store(context, built, log_plugin)
