"""Run a suite: ``python -m benchmarks.run --suite smoke``.

Each run (strategy or variant, dataset, task count or half-base split, seed) trains task after
task, evaluates every stage from the strategy's scores, checkpoints after every task, and writes
one result JSON (``benchmarks.runner.execute``). Finished runs with the same resolved config are
skipped; killed runs resume from their last finished task. The runs execute here, in local worker
processes or as SLURM jobs (``benchmarks.runner.launcher``); the results table is printed here, once.
Mistakes in the command line or the environment print one line and exit with 2.

This module is the parser and imports nothing heavy, so ``--help`` and a refused option answer at
once; the body, which needs torch, open_clip and Avalanche, is ``benchmarks.run_suite``.
"""

from __future__ import annotations

import argparse
import sys

from benchmarks.core.choices import AUGMENT_ON, GPU_CHECK_COMMAND, LAUNCHERS, PRECISIONS
from benchmarks.core.errors import CommandParser, UserError, one_line_user_errors
from benchmarks.core.imports import heavy_imports
from benchmarks.runner.limits import FAST_DEV_RUN_BATCHES, RunLimits
from benchmarks.runner.suite_files import suite_file

FAST = RunLimits.fast_dev_run()  # what --fast-dev-run limits, for its help


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
        "--reuse-from",
        type=_csv(str),
        metavar="DIRS",
        help="comma-separated results folders (a shared store, another suite's) whose finished result of a "
        "run's exact config is copied, not recomputed; the folders of the suite's base suites "
        "(runs/BASE) are always looked in",
    )
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
        help=f"with --dry-run: the pipeline.json of a GPU check ({GPU_CHECK_COMMAND}) to turn into "
        "GPU-hours (default: the newest gpu_check/*/pipeline.json beside the results folder or under ./runs)",
    )
    args = parser.parse_args(argv)
    for name in ("results_dir", "data_root", "weights", "rates"):  # "$OUT" with OUT unset
        if getattr(args, name) is not None and not getattr(args, name).strip():
            raise UserError(
                f"--{name.replace('_', '-')} is empty; give a path (an empty value never means the "
                "default, whose results --force would replace)"
            )
    return args


@one_line_user_errors
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)  # --help and a refused option end here, before torch is imported
    suite_file(args.suite)  # and a misspelt suite
    from benchmarks.runner.suites import check_selection, check_strategy_names, load_suite  # no torch either

    suite = load_suite(args.suite)
    check_strategy_names(suite, args.strategies)  # and a slip in the suite or a name
    check_selection(suite, args.strategies, args.datasets, args.tasks, args.seeds)  # or in --tasks, --seeds
    with heavy_imports():
        from benchmarks.run_suite import run_suite  # torch, open_clip and Avalanche: seconds to import

    return run_suite(args, argv)


if __name__ == "__main__":
    sys.exit(main())
