"""Tune a suite's strategies on a validation split, never on the test set:
``python -m benchmarks.tune --suite smoke-baselines --strategies gr4cil,finetune --space space.toml``.

Each strategy gets its own Optuna study and the same budget (``--trials``). A trial is the suite's
runs of that strategy (its datasets, task counts, seeds) with the trial's option values, executed by
the runner (``benchmarks.runner.execute``: locks, checkpoints, a finished run never recomputed) with a
validation split held out of each class's training images and ``evaluate_test = false``: the test
split is never read. The objective is the mean over those runs of their validation ``avg_acc``
(``val_avg``) or ``last_acc`` (``val_last``).

The search space is a TOML file, one table per strategy label, one entry per Config field::

    [gr4cil]
    lr = {low = 1e-4, high = 1e-2, log = true}   # a float (or whole-number) range
    weight_decay = {low = 0.0, high = 0.2}
    lora_rank = {choices = [4, 8, 16]}           # a choice among values

The study lives in SQLite under the results folder (``--storage``: an Optuna storage URL). Several
workers given the same command (local processes, a SLURM job array) share the study and its budget:
together they run exactly ``--trials`` trials. Each trial's runs go in
``trials/<label>/<params digest>/``, so a killed tune rerun with the same command resumes: a trial
killed half-way is asked again with the same values and its runs resume from their checkpoints.
At the end the best values of each strategy are written as a suite file (``tuned.toml``) that
``python -m benchmarks.run --suite <file>`` runs on the test set: each official row beside its
``<label>-tuned`` variant, whose ``[tuned.<label>-tuned]`` table records the space, budget,
sampler, seed and every trial. Mistakes print one line and exit with 2.
"""

from __future__ import annotations

import argparse
import math
import sys

from benchmarks.core.choices import DEFAULT_VALIDATION_FRACTION, MAX_VALIDATION_FRACTION, OBJECTIVES
from benchmarks.core.errors import CommandParser, one_line_user_errors
from benchmarks.core.imports import heavy_imports
from benchmarks.runner.suite_files import suite_file


def _csv(kind):
    def parse(text: str) -> list:
        try:
            return [kind(part) for part in text.split(",") if part]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list") from None

    return parse


def _task(text: str) -> int | str:
    return int(text) if text.isdigit() else text


def _fraction(text: str) -> float:
    try:
        fraction = float(text)
    except ValueError:
        fraction = math.nan
    if not 0 < fraction <= MAX_VALIDATION_FRACTION:
        raise argparse.ArgumentTypeError(f"a fraction in (0, {MAX_VALIDATION_FRACTION}], not {text!r}")
    return fraction


def _whole(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"a whole number >= 0, not {text!r}")
    return int(text)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a trial budget is a whole number >= 1, not {text!r}")
    return int(text)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CommandParser(prog="python -m benchmarks.tune", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--suite", required=True, help="suite name (benchmarks/suites/NAME.toml) or a .toml path"
    )
    parser.add_argument("--strategies", type=_csv(str), required=True, help="comma-separated labels to tune")
    parser.add_argument("--space", required=True, help="search-space TOML: a [LABEL] table of Config fields")
    parser.add_argument(
        "--trials", type=_positive, required=True, help="trials per strategy (the same for each)"
    )
    parser.add_argument("--objective", choices=sorted(OBJECTIVES), default="val_avg")
    parser.add_argument("--storage", help="an Optuna storage URL (default: SQLite in the results folder)")
    parser.add_argument("--sampler-seed", type=int, default=0, help="the TPE sampler's seed (default 0)")
    parser.add_argument(
        "--validation-fraction",
        type=_fraction,
        help="held out of each class's training images "
        f"(default: the suite's, else {DEFAULT_VALIDATION_FRACTION})",
    )
    parser.add_argument(
        "--validation-seed", type=_whole, help="which images are held out (default: the suite's, else 0)"
    )
    parser.add_argument(
        "--datasets", type=_csv(str), help="comma-separated dataset names (default: the suite's)"
    )
    parser.add_argument("--tasks", type=_csv(_task), help="comma-separated task counts or splits")
    parser.add_argument(
        "--seeds", type=_csv(int), help="comma-separated seeds of each trial (default: the suite's)"
    )
    parser.add_argument("--results-dir", help="the tune's folder (default: runs/tune/SUITE)")
    parser.add_argument("--data-root", default="data", help="folder holding the datasets (default: ./data)")
    parser.add_argument("--out", help="the tuned suite file (default: RESULTS_DIR/tuned.toml)")
    parser.add_argument("--quiet", action="store_true", help="no line per trial")
    args = parser.parse_args(argv)
    parser.output_file(args.out)  # before the trials, not after them
    return args


@one_line_user_errors
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)  # --help and a refused option end here, before torch is imported
    suite_file(args.suite)  # and a misspelt suite
    from benchmarks.runner.suites import check_strategy_names, load_suite  # no torch either
    from benchmarks.tune_space import space_tables

    suite = load_suite(args.suite)  # and a slip in the suite, a strategy's name or the space's tables
    check_strategy_names(suite, args.strategies)
    if args.validation_fraction is None:
        args.validation_fraction = suite.get("validation_fraction", DEFAULT_VALIDATION_FRACTION)
    if args.validation_seed is None:
        args.validation_seed = suite.get("validation_seed", 0)
    tables = space_tables(args.space, args.strategies, suite)
    with heavy_imports():
        from benchmarks.tune_study import run_tune  # the runner: torch, open_clip and Avalanche

    return run_tune(args, argv, suite, tables)


if __name__ == "__main__":
    sys.exit(main())
