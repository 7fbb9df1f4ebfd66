"""Compare strategies against a baseline (GR4CIL by default), paired and with intervals.

``python -m analysis.compare --results-dir DIR [--baseline gr4cil] [--strategies a,b]
[--metric last|avg|forgetting|bwt] [--out DIR]``

For each dataset and task count, and each strategy against the baseline:

- mean ± std over seeds of both, with n;
- the paired difference (strategy minus baseline) over the seeds both ran, with a 95 % interval
  from a bootstrap over seeds and test images (``analysis.statistics``), both strategies scored
  on the same resampled images;
- a verdict: "better", "worse" or "no detectable difference at 95 %" (for forgetting, lower is
  better: "better" means the strategy forgets less);
- the smallest difference that the seeds and images at hand detect with 80 % power.

Where a suite ran several class orders, the runs pair by (class order, seed) and the interval
resamples those units and the test images; n reads as orders x seeds, and a section "By class
order" gives each order's difference with its interval and how the differences' variance splits
between orders and seeds (``analysis.orders``, ``analysis.statistics.order_variance``).

Forgetting and backward transfer (BWT) are functions of every task's accuracy at every stage: with
predictions, each image resample recomputes that matrix for both strategies, then their metrics and
the difference (as Avg recomputes every stage's accuracy). With one task they are undefined, and
such comparisons are left out with a note.

Results stored without per-image predictions (schema version 1, or a sidecar missing or damaged)
still count: their comparison resamples seeds only, and says so. The command refuses, with one
line and exit status 2, runs that differ in protocol (evaluation protocol, class order, data,
backbone, weights, task count, precision or test set), and pairs that share no seed (their unpaired
means are shown). ``--across-protocols`` pairs runs of two evaluation protocols (main and
main-as-published, given as two ``--results-dir`` folders), resampling seeds only.

Writes ``compare-<metric>.md``, ``.csv`` and ``.tex``, and per strategy a figure
``compare-<label>-<metric>.png``/``.pdf`` (characters other than letters, digits, ``.``, ``_``
and ``-`` in the label become ``_``) (accuracy per stage with 95 % bands, and a forest plot of
the differences), into ``--out`` (default: ``DIR/compare``).

The runs and what they must share are ``analysis.paired_runs``; the pairing and its statistics
``analysis.pairing``; the tables and figures ``analysis.comparison_output``; this module is the
command.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analysis.comparison_output import render_markdown, write_comparison
from analysis.pairing import DRAWS, METRICS, check_draws, compare_all, unpaired_refusal
from benchmarks.core.errors import CommandParser, one_line_storage_errors, one_line_user_errors, output_folder


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = CommandParser(prog="python -m analysis.compare", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--results-dir",
        required=True,
        nargs="+",
        help="folder(s) of result JSON (searched recursively), e.g. runs/main runs/main-as-published",
    )
    parser.add_argument(
        "--across-protocols",
        action="store_true",
        help="pair runs of different evaluation protocols (class order, split, names; seeds resampled only)",
    )
    parser.add_argument("--baseline", default="gr4cil", help="label to compare against (default: gr4cil)")
    parser.add_argument("--strategies", help="comma-separated labels (default: every other label)")
    parser.add_argument("--metric", default="last", choices=list(METRICS), help="default: last")
    parser.add_argument("--out", help="folder for the tables and figures (default: RESULTS_DIR/compare)")
    parser.add_argument("--draws", type=int, default=DRAWS, help=f"bootstrap replicates (default {DRAWS})")
    return parser.parse_args(argv)


@one_line_user_errors
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problems: list[str] = []
    check_draws(args.draws)
    # checked before the bootstrap: a file in the way would otherwise stop it after all the work
    out = output_folder(args.out, "--out") if args.out else Path(args.results_dir[0]) / "compare"
    comparisons = compare_all(
        args.results_dir,
        args.baseline,
        args.strategies.split(",") if args.strategies else None,
        args.metric,
        args.draws,
        problems,
        across_protocols=args.across_protocols,
    )
    for line in problems:
        print(f"warning: {line}", file=sys.stderr)
    print(render_markdown(comparisons), end="")
    with one_line_storage_errors("write the comparison", "free space, fix permissions or give another --out"):
        paths = write_comparison(comparisons, out, problems)
    print(f"wrote {len(paths)} files to {paths[0].parent}", file=sys.stderr)
    if (refusal := unpaired_refusal(comparisons)) is not None:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
