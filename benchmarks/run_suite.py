"""The body of ``python -m benchmarks.run``, once its arguments are parsed (``benchmarks.run``).

Resolves the suite's runs, answers ``--dry-run`` or hands the runs to a launcher, and prints the
results table once. It imports torch, open_clip and Avalanche (seconds), which is why the parser
lives apart: ``--help`` and a refused option never wait for them.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Literal

from benchmarks.core.environment import check_threads, set_deterministic, usable_cores
from benchmarks.core.errors import STORAGE_ERRORS, UserError
from benchmarks.prepare.command import readiness
from benchmarks.runner.building import backbone_spec, resolve, settings_from_the_suite
from benchmarks.runner.execute import preflight
from benchmarks.runner.gpu_hours import (
    Rates,
    find_rates,
    gpu_hours_line,
    read_rates,
    reference_rates,
)
from benchmarks.runner.launcher import (
    InlineLauncher,
    Launcher,
    RunOptions,
    nothing_finished,
    prepare_runner_process,
    watch_launcher,
)
from benchmarks.runner.limits import RunLimits
from benchmarks.runner.live_log import parse_loggers
from benchmarks.runner.local_launcher import (
    LocalLauncher,
    auto_workers,
    check_gpus,
    check_workers,
    sampled_idle_cores,
)
from benchmarks.runner.reading import iter_results
from benchmarks.runner.results import ResultStore
from benchmarks.runner.run_spec import RunSpec
from benchmarks.runner.status import run_state, slurm_view
from benchmarks.runner.suite_files import SUITES_DIR
from benchmarks.runner.suite_progress import duration, why_workers
from benchmarks.runner.suites import expand, load_suite, suite_bases
from benchmarks.runner.termination import Terminated, restore_sigterm, stop_on_sigterm


def dry_run_table(
    runs: list[RunSpec],
    store: ResultStore,
    data_root: str,
    gpu_rates: Rates | None | Literal[False] = False,
    reuse_from: tuple[str, ...] = (),
) -> str:
    """One row per run of the suite: its state in ``store`` and an estimate of what is left to
    compute; then what the runs read (data, weights), present or missing with the ``prepare``
    command that brings it (``benchmarks.prepare.command.readiness``). The estimate comes from the
    ``cost`` of finished runs of the same strategy and dataset (mean train + evaluation seconds a
    task, times the tasks left); runs without one make the total a lower bound, or leave none. With
    ``gpu_rates`` (a GPU check's measured rates, the stored reference rates, or None: how to measure
    them; False: a CPU suite, no line) a last line gives the GPU-hours the runs left take at those
    rates (``benchmarks.runner.gpu_hours``): a plan made before any run has finished."""
    per_task: dict[tuple[str, str], list[float]] = {}
    for _, result in iter_results(store.root, skipped=[]):
        cost = result.get("cost") or {}
        if "train_seconds" in cost:
            seconds = (cost["train_seconds"] + cost.get("eval_seconds", 0.0)) / result["n_tasks"]
            per_task.setdefault((result["strategy"], result["dataset"]), []).append(seconds)
    lines = ["| run | state | estimated cost left |", "|---|---|---|"]
    total, estimated, unknown = 0.0, 0, 0
    slurm = slurm_view(store, [spec.key for spec in runs])  # one question for every queued run
    pending: list[tuple[RunSpec, dict, int]] = []  # the runs left, for the GPU-hours
    for spec in runs:
        resolved = resolve(spec, data_root)
        config = resolved.config
        state = run_state(store, spec.key, resolved.config_hash, slurm)
        elsewhere = store.finished_elsewhere(spec.key, resolved.config_hash, reuse_from)
        source = None if state.state in ("finished", "running") else next(elsewhere, None)
        if source is not None:  # copied when the suite runs (ResultStore.reuse), never computed
            state = replace(state, state="to reuse", detail=f"finished in {source[0].root}")
        left = 0 if state.state in ("finished", "running", "to reuse") else spec.n_tasks - state.tasks_done
        estimate = "-"
        if left:
            pending.append((spec, config, state.tasks_done))
            samples = per_task.get((spec.strategy, spec.dataset))
            if samples:
                seconds = left * sum(samples) / len(samples)
                total += seconds
                estimated += 1
                estimate = duration(seconds)
            else:
                unknown += 1
                estimate = "no finished run of this strategy and dataset yet"
        detail = f" ({state.detail})" if state.detail else ""
        lines.append(f"| {spec.key} | {state.state}{detail} | {estimate} |")
    if unknown and not estimated:  # a sum of no estimates is no estimate, not 0 s
        time_left = (
            f", {unknown} left to run; no estimate yet (no finished run of these strategies and datasets)"
        )
    elif unknown:  # the runs without an estimate add to it
        time_left = f"; at least {duration(total)} left, plus {unknown} run(s) without an estimate"
    else:
        time_left = f"; estimated {duration(total)} left"
    gpu = [] if gpu_rates is False else [gpu_hours_line(pending, gpu_rates)]
    datasets = [name for spec in runs for name in (spec.dataset, *spec.zero_shot_targets)]
    needs = readiness(datasets, [backbone_spec(spec) for spec in runs], data_root)
    needs = ["", "What the runs read:", *(f"- {line}" for line in needs)] if needs else []
    return "\n".join([*lines, *needs, "", f"{len(runs)} run(s){time_left}", *gpu])


def suite_title(suite: dict) -> str:
    """``suite 'smoke'`` for a shipped suite, ``suite 'mine' (path/to/mine.toml)`` for a file, so
    that a file named suite.toml does not read "suite suite"."""
    shipped = Path(suite["path"]).parent == SUITES_DIR
    return f"suite {suite['name']!r}" + ("" if shipped else f" ({suite['path']})")


def _threads(value: object, args: argparse.Namespace):
    """``--threads`` or the suite's ``threads``, checked: a count above the cores this process may
    use only makes the threads wait on each other (load in the thousands on two cores), so it is
    refused, except for SLURM jobs, which run on other machines with their own cores."""
    threads = check_threads(value)
    if threads != "auto" and threads > usable_cores() and args.launcher != "slurm":
        raise UserError(
            f"threads {threads} is more than the {usable_cores()} core(s) this process may use; "
            'give at most that, or "auto"'
        )
    return threads


def _named_launcher(args: argparse.Namespace) -> str | None:
    """The launcher the command names, or the local one that ``--workers`` or ``--gpus`` imply;
    None: the suite's ``workers`` decide once the runs are known (``_launcher_for_runs``)."""
    return args.launcher or ("local" if args.workers is not None or args.gpus else None)


def _launcher_for_runs(named: str | None, workers: int, force: bool) -> str:
    """``named``, or local where the suite asks for more than one worker (``workers``, resolved);
    inline with ``--force``, which the local launcher refuses (another worker could recompute a run)."""
    if named is not None:
        return named
    return "local" if workers > 1 and not force else "inline"


def _check_launcher_options(args: argparse.Namespace, launcher: str | None, suite: dict):
    """Reject options that do not belong to the chosen launcher (``launcher``: None until the
    suite's workers choose, inline or local); the SLURM options, resolved (suite ``[launcher]``
    table, then the command line), for ``--launcher slurm``."""
    slurm_given = {
        name.removeprefix("slurm_"): value for name, value in vars(args).items() if name.startswith("slurm_")
    }
    if launcher != "slurm" and (any(v is not None for v in slurm_given.values()) or args.no_wait):
        raise UserError("--slurm-* options and --no-wait belong to --launcher slurm")
    if launcher != "local" and (args.workers is not None or args.gpus):
        raise UserError("--workers and --gpus belong to --launcher local")
    if launcher == "local":
        check_gpus(args.gpus)
    if launcher in ("local", "slurm") and args.force:
        raise UserError(
            f"--force with --launcher {launcher} could recompute a run that another process "
            "holds; delete the results to recompute, or use --force with the inline launcher"
        )
    if launcher != "slurm":
        return None
    from benchmarks.runner.slurm_launcher import SlurmOptions, check_slurm  # submitit: only for SLURM

    options = SlurmOptions.resolve(suite.get("launcher", {}), slurm_given)
    if not args.dry_run:
        check_slurm()
    return options


def _launcher(
    launcher: str,
    args: argparse.Namespace,
    argv: list[str] | None,
    workers: int,
    slurm_options,
    suite: str,
) -> Launcher:
    if launcher == "local":
        return LocalLauncher(sys.argv[1:] if argv is None else list(argv), workers, args.gpus)
    if launcher == "slurm":
        from benchmarks.runner.slurm_launcher import SlurmLauncher

        return SlurmLauncher(slurm_options, f"cil-{suite}", wait=not args.no_wait)
    return InlineLauncher()


def _gpu_rates(args: argparse.Namespace, suite: dict, results_dir: Path) -> Rates | Literal[False]:
    """The GPU rates for a dry run's GPU-hours line: those of ``--rates`` or the newest GPU check,
    else the stored reference rates (named as such); False (no line) for a fast dev run, or a suite
    run on the CPU without ``--rates`` (the smoke suites: GPU-hours mean nothing there)."""
    if args.fast_dev_run is not None:
        return False
    if args.rates is None and (args.device or suite.get("device", "auto")) == "cpu":
        return False
    path = find_rates(args.rates, results_dir)
    return read_rates(path) if path is not None else reference_rates()


def _reuse_sources(given: list[str] | None, suite: dict, suffix: str) -> tuple[str, ...]:
    """The results folders whose finished runs a run copies instead of computing: ``--reuse-from``
    (each must exist), then the default folder of each base suite (``runs/BASE``, with a fast dev
    run's ``suffix``) that exists; absolute, since workers and SLURM jobs may start elsewhere."""
    for folder in given or []:
        if not Path(folder).is_dir():
            raise UserError(f"--reuse-from {folder}: no such folder; give a folder of results")
    bases = [Path("runs") / (name + suffix) for name in suite_bases(suite)]
    folders = [*map(Path, given or []), *(path for path in bases if path.is_dir())]
    return tuple(dict.fromkeys(str(folder.resolve()) for folder in folders))


def _why_at_once(
    launcher: str, named: str | None, count: int, workers: object, device: str, idle: int | None, runs: int
) -> str:
    """The start line's reason for running one at a time or side by side; none for SLURM."""
    if launcher == "slurm":
        return ""
    if launcher == "inline" and named is None and count > 1:  # --force: the local launcher refuses it
        return "; one run at a time (--force recomputes here, never in shared workers)"
    return "; " + why_workers(count if launcher == "local" else 1, workers, named, device, idle, runs)


def run_suite(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    """Run the suite that ``args`` (``benchmarks.run.parse_args``) names; ``argv``: the command's
    arguments, handed to local workers (None: this process's). The exit status."""
    started = time.monotonic()
    prepare_runner_process()
    sigterm = stop_on_sigterm()  # SIGTERM stops as Ctrl-C does: locks released, workers ended
    watch_launcher()  # a local launcher's worker: end with the launcher, however it ends
    try:
        loggers = parse_loggers(args.log)  # a logger that cannot start: one line, before any run
        suite = load_suite(args.suite)
        threads = _threads(args.threads if args.threads is not None else suite.get("threads", "auto"), args)
        workers = check_workers(args.workers if args.workers is not None else suite.get("workers", 1))
        named = _named_launcher(args)
        # bad launcher input: one line, before anything runs
        slurm_options = _check_launcher_options(args, named, suite)
        if args.rates is not None and not args.dry_run:
            raise UserError("--rates belongs to --dry-run: it turns measured rates into GPU-hours")
        device, weights = args.device, args.weights
        fast_dev_run = args.fast_dev_run is not None
        limits = RunLimits.fast_dev_run(args.fast_dev_run) if fast_dev_run else None
        if slurm_options is not None:
            if (device or suite.get("device", "auto")) == "auto":
                device = "cuda" if slurm_options.gpus else "cpu"  # the jobs' device, not this login node's
            if weights and Path(weights).exists():
                weights = str(Path(weights).resolve())  # a job may start in another folder
        runs = expand(
            suite,
            strategies=args.strategies,
            datasets=args.datasets,
            tasks=args.tasks,
            # seeds add no code path: a fast dev run takes the suite's first unless told otherwise
            seeds=args.seeds if args.seeds is not None else (suite["seeds"][:1] if fast_dev_run else None),
            device=device,
            class_order=args.class_order,
            weights=weights,
            precision=args.precision,
            deterministic=args.deterministic or None,
            augment_on=args.augment_on,
            check_device=slurm_options is None,
            limits=limits,
        )
        if any(spec.deterministic for spec in runs) and slurm_options is None:
            set_deterministic(True)  # before any CUDA work: cuBLAS reads its workspace setting once
        suffix = "-fast-dev-run" if fast_dev_run else ""  # never beside real results
        results_dir = Path(args.results_dir or Path("runs") / (suite["name"] + suffix))
        store = ResultStore(results_dir)
        reuse_from = _reuse_sources(args.reuse_from, suite, suffix)
        if args.dry_run:
            rates = _gpu_rates(args, suite, results_dir)
            print(dry_run_table(runs, store, args.data_root, rates, reuse_from))
            return 0
        resolved = preflight(
            runs, args.data_root, store=store, force=args.force, save_models=args.save_models
        )
        bars = not args.quiet and sys.stderr.isatty()  # a log file gets one line per task instead
        options = RunOptions(
            data_root=args.data_root,
            force=args.force,
            quiet=not bars,
            task_lines=not args.quiet and not bars,
            threads=threads,
            save_models=args.save_models,
            run_logs=args.run_logs,
            suite_name=suite["name"],
            log=loggers,
            reuse_from=reuse_from,
        )
        # how many runs at once, once: "auto" samples the idle cores (the count moves no number)
        run_device = runs[0].device
        sharing = named in (None, "local")
        idle = sampled_idle_cores(workers, run_device) if sharing else None
        count = auto_workers(workers, run_device, len(runs), idle) if sharing else 1
        launcher = _launcher_for_runs(named, count, args.force)
        if not args.quiet:
            print(
                f"{suite_title(suite)}: {len(runs)} run(s) -> {results_dir}"
                + _why_at_once(launcher, named, count, workers, run_device, idle, len(runs)),
                file=sys.stderr,
            )
        for label, dataset in dict.fromkeys((s.label, s.dataset) for s in runs if ":" in s.strategy):
            run = next(r for r in resolved if (r.spec.label, r.spec.dataset) == (label, dataset))
            # an outside strategy: say what the suite's protocol gave it (docs/adding-a-strategy.md)
            print(settings_from_the_suite(label, dataset, run.config), file=sys.stderr)
        outcome = _launcher(launcher, args, argv, count, slurm_options, suite["name"]).launch(
            resolved, store, options
        )
        if not outcome.show_table:
            return outcome.code
        if outcome.finished:
            from analysis.tables import write_tables  # the one place that prints the results table

            print(write_tables(results_dir, outcome.finished))
        elif launcher in ("inline", "local"):
            print(nothing_finished(outcome), file=sys.stderr)
        if not args.quiet:
            print(
                f"{suite_title(suite)}: {len(outcome.finished)} of {len(runs)} run(s) finished in "
                f"{duration(time.monotonic() - started)}",
                file=sys.stderr,
            )
        if outcome.code:
            print(
                f"error: {len(runs) - len(outcome.finished)} of {len(runs)} run(s) did not finish; see "
                f"python -m benchmarks.runner.status --results-dir {results_dir}",
                file=sys.stderr,
            )
        return outcome.code
    except OSError as err:
        if err.errno not in STORAGE_ERRORS:
            raise
        where = f" ({err.filename})" if err.filename else ""
        print(
            f"error: cannot write the results{where}: {err.strerror}; free space or fix permissions (or give "
            "another --results-dir) and rerun: finished tasks are kept",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt as err:
        print("interrupted: rerun the same command to resume from the last finished task", file=sys.stderr)
        return 143 if isinstance(err, Terminated) else 130  # 128 + SIGTERM, as a shell reports it
    finally:
        restore_sigterm(sigterm)
