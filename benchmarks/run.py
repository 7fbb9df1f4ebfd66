"""Run a suite: ``python -m benchmarks.run --suite smoke``.

Each run (strategy or variant, dataset, task count or half-base split, seed) trains task after
task, evaluates every stage from the strategy's scores, checkpoints after every task, and writes
one result JSON (``benchmarks.runner.execute``). Finished runs with the same resolved config are
skipped; killed runs resume from their last finished task. The runs execute here, in local worker
processes or as SLURM jobs (``benchmarks.runner.launcher``); the results table is printed here, once.
Mistakes in the command line or the environment print one line and exit with 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.core.environment import check_threads, set_deterministic, usable_cores
from benchmarks.core.errors import STORAGE_ERRORS, CommandParser, UserError, one_line_user_errors
from benchmarks.core.precision import PRECISIONS
from benchmarks.data.device_augment import AUGMENT_ON
from benchmarks.prepare.command import readiness
from benchmarks.runner.building import backbone_spec, resolve, settings_from_the_suite
from benchmarks.runner.execute import preflight
from benchmarks.runner.gpu_hours import (
    MEASURE_COMMAND,
    Rates,
    find_rates,
    gpu_hours_line,
    read_rates,
    reference_rates,
)
from benchmarks.runner.launcher import (
    LAUNCHERS,
    InlineLauncher,
    Launcher,
    RunOptions,
    Terminated,
    nothing_finished,
    prepare_runner_process,
    restore_sigterm,
    stop_on_sigterm,
    watch_launcher,
)
from benchmarks.runner.live_log import parse_loggers
from benchmarks.runner.local_launcher import LocalLauncher, auto_workers, check_gpus, check_workers
from benchmarks.runner.reading import iter_results
from benchmarks.runner.results import ResultStore
from benchmarks.runner.status import run_state, slurm_view
from benchmarks.runner.suites import FAST_DEV_RUN_BATCHES, SUITES_DIR, RunLimits, RunSpec, expand, load_suite

FAST = RunLimits.fast_dev_run()  # what --fast-dev-run limits, for its help


def dry_run_table(
    runs: list[RunSpec], store: ResultStore, data_root: str, gpu_rates: Rates | None | bool = False
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
        left = 0 if state.state in ("finished", "running") else spec.n_tasks - state.tasks_done
        estimate = "-"
        if left:
            pending.append((spec, config, state.tasks_done))
            samples = per_task.get((spec.strategy, spec.dataset))
            if samples:
                seconds = left * sum(samples) / len(samples)
                total += seconds
                estimated += 1
                estimate = _duration(seconds)
            else:
                unknown += 1
                estimate = "no finished run of this strategy and dataset yet"
        detail = f" ({state.detail})" if state.detail else ""
        lines.append(f"| {spec.key} | {state.state}{detail} | {estimate} |")
    if unknown and not estimated:  # a sum of no estimates is no estimate, not 0 s
        left = f", {unknown} left to run; no estimate yet (no finished run of these strategies and datasets)"
    elif unknown:  # the runs without an estimate add to it
        left = f"; at least {_duration(total)} left, plus {unknown} run(s) without an estimate"
    else:
        left = f"; estimated {_duration(total)} left"
    gpu = [] if gpu_rates is False else [gpu_hours_line(pending, gpu_rates)]
    datasets = [name for spec in runs for name in (spec.dataset, *spec.zero_shot_targets)]
    needs = readiness(datasets, [backbone_spec(spec) for spec in runs], data_root)
    needs = ["", "What the runs read:", *(f"- {line}" for line in needs)] if needs else []
    return "\n".join([*lines, *needs, "", f"{len(runs)} run(s){left}", *gpu])


def suite_title(suite: dict) -> str:
    """``suite 'smoke'`` for a shipped suite, ``suite 'mine' (path/to/mine.toml)`` for a file, so
    that a file named suite.toml does not read "suite suite"."""
    shipped = Path(suite["path"]).parent == SUITES_DIR
    return f"suite {suite['name']!r}" + ("" if shipped else f" ({suite['path']})")


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def _csv(kind):
    def parse(text: str):
        try:
            return [kind(item) for item in text.split(",") if item]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")

    return parse


def _count_or_split(item: str) -> int | str:
    """A ``--tasks`` entry: a task count, or a split ``B50-Inc10`` (checked by ``expand``)."""
    return int(item) if item.lstrip("-").isdigit() else item


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CommandParser(prog="python -m benchmarks.run", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--suite", default="smoke", help="suite name (benchmarks/suites/NAME.toml) or a .toml path"
    )
    parser.add_argument("--strategies", type=_csv(str), help="comma-separated strategies or variant labels")
    parser.add_argument("--datasets", type=_csv(str), help="comma-separated dataset names")
    parser.add_argument(
        "--tasks",
        type=_csv(_count_or_split),
        help="comma-separated task counts or half-base splits, e.g. 5,10,B50-Inc10 (a first task of 50 "
        "classes, then tasks of 10)",
    )
    parser.add_argument("--seeds", type=_csv(int), help="comma-separated seeds")
    parser.add_argument("--results-dir", help="where result JSON goes (default: runs/SUITE)")
    parser.add_argument("--data-root", default="data", help="folder holding the datasets (default: ./data)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], help="default: the suite's, else auto")
    parser.add_argument(
        "--precision",
        choices=["auto", *PRECISIONS],
        help="fp32, tf32 (fp32 with TF32 matmuls on CUDA), fp16 (autocast + loss scaling) or bf16; "
        "default: the suite's, else auto (fp16 on CUDA, fp32 on CPU)",
    )
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="deterministic CUDA kernels (torch.use_deterministic_algorithms): bit-identical GPU "
        "reruns, somewhat slower; CPU runs are bit-identical without it",
    )
    parser.add_argument(
        "--augment-on",
        choices=AUGMENT_ON,
        help="where pixels are augmented: device (default: in batches on the run's device) or pil "
        "(torchvision's PIL pipeline, per sample); both give the same pixels",
    )
    parser.add_argument("--weights", help="local CLIP weight file (overrides the suite's pretrained tag)")
    parser.add_argument(
        "--class-order",
        type=_csv(str),
        help="seed1993 (default), seedN, or a fixed list: dytox (CIFAR-100), mg_clip_imagenet_r "
        "(ImageNet-R); comma-separated for several (seed1993,seed0: one run per order and seed); "
        "overrides the suite's and its protocol's",
    )
    parser.add_argument("--force", action="store_true", help="recompute finished runs")
    parser.add_argument(
        "--save-models",
        action="store_true",
        help="also save each finished run's learned state (safetensors + JSON) next to its result",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no start line, no progress bars and no per-task lines (without it: bars on a terminal, "
        "a line per finished task in a log)",
    )
    parser.add_argument(
        "--threads",
        help='torch threads of each run process: a number, or "auto" (the default, or the suite\'s '
        "threads): one on the CPU, every core on CUDA; recorded in each result's env, not hashed",
    )
    parser.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        help="inline: runs one after another here (the default, unless the suite's workers or "
        "--workers ask for more than one); local: --workers processes on this machine, sharing the "
        "runs through their locks; slurm: one SLURM job per unfinished run, as a job array (submitit)",
    )
    parser.add_argument(
        "--workers",
        help='local launcher: worker processes, a number or "auto" (one per idle core on the CPU, one on '
        "CUDA; never more than the runs to compute); default: the suite's workers, else 1. More "
        "than one picks the local launcher unless --launcher says otherwise",
    )
    parser.add_argument(
        "--gpus", type=_csv(int), help="local launcher: GPU ids, worker i gets gpus[i %% len]"
    )
    slurm = parser.add_argument_group("slurm launcher (override the suite's [launcher] table)")
    slurm.add_argument("--slurm-partition", help="partition")
    slurm.add_argument(
        "--slurm-time",
        type=int,
        help="time limit of a job, minutes (default 1440); a job that reaches it is requeued and resumes",
    )
    slurm.add_argument("--slurm-gpus", type=int, help="GPUs per job (default 1)")
    slurm.add_argument("--slurm-cpus", type=int, help="CPUs per job (default 8)")
    slurm.add_argument("--slurm-mem-gb", type=float, help="memory per job, GB (default: the partition's)")
    slurm.add_argument(
        "--slurm-array-parallelism", type=int, help="jobs of the array running at once (default 64)"
    )
    slurm.add_argument("--slurm-account", help="account to charge")
    slurm.add_argument("--slurm-qos", help="quality of service")
    slurm.add_argument("--slurm-constraint", help="node constraint, e.g. a100")
    slurm.add_argument(
        "--slurm-setup",
        action="append",
        metavar="LINE",
        help="a shell line run before each job, e.g. 'module load cuda' (repeatable)",
    )
    parser.add_argument(
        "--no-wait",
        action="store_true",
        help="slurm launcher: exit once submitted; rerun the same command to collect the results "
        "(nothing is submitted twice)",
    )
    parser.add_argument(
        "--run-logs", action="store_true", help=argparse.SUPPRESS
    )  # set by the local launcher
    parser.add_argument(
        "--fast-dev-run",
        nargs="?",
        const=FAST_DEV_RUN_BATCHES,
        type=int,
        metavar="BATCHES",
        help=f"walk every run end to end in minutes before the real thing: BATCHES training batches "
        f"(default {FAST_DEV_RUN_BATCHES}) of at most {FAST.batch_size} images a pass, "
        f"{FAST.train_images_per_class} training image a class, "
        f"{FAST.test_images_per_task} test image a task, the suite's first seed unless --seeds says "
        "otherwise; results go to runs/SUITE-fast-dev-run and are marked as such",
    )
    parser.add_argument(
        "--log",
        metavar="LOGGERS",
        help="live logs of each run, any of tensorboard,wandb,csv: loss and learning rate per "
        "iteration, accuracy, per-task accuracy, routing accuracy and AUROC per stage, under "
        "RESULTS_DIR/.logs/ (W&B offline unless WANDB_MODE says otherwise)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="list every run with its state (finished, partial, running, to run) and an estimated "
        "cost from finished runs of the same strategy and dataset, and, for a GPU suite, the GPU-hours "
        "left at the rates a GPU check measured; run nothing",
    )
    parser.add_argument(
        "--rates",
        metavar="FILE",
        help=f"with --dry-run: the pipeline.json of a GPU check ({MEASURE_COMMAND}) to turn into "
        "GPU-hours (default: the newest gpu_check/*/pipeline.json beside the results folder or under ./runs)",
    )
    return parser.parse_args(argv)


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


def _gpu_rates(args: argparse.Namespace, suite: dict, results_dir: Path) -> Rates | bool:
    """The GPU rates for a dry run's GPU-hours line: those of ``--rates`` or the newest GPU check,
    else the stored reference rates (named as such); False (no line) for a fast dev run, or a suite
    run on the CPU without ``--rates`` (the smoke suites: GPU-hours mean nothing there)."""
    if args.fast_dev_run is not None:
        return False
    if args.rates is None and (args.device or suite.get("device", "auto")) == "cpu":
        return False
    path = find_rates(args.rates, results_dir)
    return read_rates(path) if path is not None else reference_rates()


@one_line_user_errors
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
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
        default_dir = suite["name"] + ("-fast-dev-run" if fast_dev_run else "")  # never beside real results
        results_dir = Path(args.results_dir or Path("runs") / default_dir)
        store = ResultStore(results_dir)
        if args.dry_run:
            print(dry_run_table(runs, store, args.data_root, _gpu_rates(args, suite, results_dir)))
            return 0
        preflight(runs, args.data_root, store=store, force=args.force, save_models=args.save_models)
        if not args.quiet:
            print(f"{suite_title(suite)}: {len(runs)} run(s) -> {results_dir}", file=sys.stderr)
        for label, dataset in dict.fromkeys((s.label, s.dataset) for s in runs if ":" in s.strategy):
            spec = next(s for s in runs if (s.label, s.dataset) == (label, dataset))
            # an outside strategy: say what the suite's protocol gave it (docs/adding-a-strategy.md)
            print(
                settings_from_the_suite(label, dataset, resolve(spec, args.data_root).config), file=sys.stderr
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
        )
        # how many runs at once, once: "auto" samples the idle cores (the count moves no number)
        count = auto_workers(workers, runs[0].device, len(runs)) if named in (None, "local") else 1
        launcher = _launcher_for_runs(named, count, args.force)
        outcome = _launcher(launcher, args, argv, count, slurm_options, suite["name"]).launch(
            runs, store, options
        )
        if not outcome.show_table:
            return outcome.code
        if outcome.finished:
            from analysis.tables import write_tables  # the one place that prints the results table

            print(write_tables(results_dir, outcome.finished))
        elif launcher in ("inline", "local"):
            print(nothing_finished(outcome), file=sys.stderr)
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


if __name__ == "__main__":
    sys.exit(main())
