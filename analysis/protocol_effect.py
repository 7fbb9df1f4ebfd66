"""How much the protocol moves each row: as-published minus one-protocol, per strategy and dataset.

As-published is each source's data protocol and its official code's behaviours together
(``benchmarks.data.protocols``' ``SOURCES``; each method card's ``[official]`` options); the two are
not split.

``python -m analysis.protocol_effect --one-protocol runs/main --as-published runs/main-as-published
[--out DIR]``, and a table of ``python -m analysis.report --as-published DIR``.

GR4CIL's Table 1 mixes protocols (``benchmarks.data.protocols``). For every strategy, dataset and
task count run under both, over the seeds both ran: the mean of each and the paired difference of
Last and Avg, with a 95 % interval from a bootstrap over those seeds (the two protocols test other
images or other class orders, so images are not paired). With one paired seed there is no interval.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.formatting import MISSING, latex_table, markdown_table, mean_std_cell, population_std
from analysis.orders import Unit
from analysis.paired_runs import Run, load_runs
from analysis.pairing import DRAWS, METRICS, TASK_METRICS, check_draws
from analysis.statistics import bootstrap_stage_means, interval, metric_of_stages
from benchmarks.core.atomic_io import atomic_write_text
from benchmarks.core.errors import (
    CommandParser,
    UserError,
    one_line_storage_errors,
    one_line_user_errors,
    output_folder,
)
from benchmarks.runner.reading import CANNOT_RANK, cannot_rank, counted, not_a_measurement, protocol_of

TABLE = "protocol_effect"


def _runs_of(
    folder: str | Path, protocol: str, problems: list[str]
) -> dict[tuple[str, int, str], dict[Unit, Run]]:
    runs = load_runs(folder, problems)
    if not runs:
        raise UserError(f"no result JSON found under {folder}; run the suite first or point at its results")
    for (dataset, n_tasks, label), seeds in runs.items():
        for unit, run in seeds.items():
            found = protocol_of(run.result)
            if found != protocol:
                raise UserError(
                    f"{folder} holds a {found!r} run ({label} / {dataset} / T={n_tasks} / seed {unit}) where "
                    f"{protocol!r} runs were expected; give each protocol's results folder to its option"
                )
    return runs


def _cell(values: list[float]) -> str:
    return mean_std_cell(float(np.mean(values)), population_std(values), n=len(values))


def protocol_effect(
    one_protocol_dir: str | Path, as_published_dir: str | Path, draws: int = DRAWS
) -> tuple[pd.DataFrame, list[str]]:
    """One row per (strategy, dataset, task count) run under both protocols; and notes."""
    problems: list[str] = []
    one = _runs_of(one_protocol_dir, "one-protocol", problems)
    published = _runs_of(as_published_dir, "as-published", problems)
    results = [run.result for runs in (one, published) for seeds in runs.values() for run in seeds.values()]
    problems += [
        f"{count} run(s) are {why}: a check of the code path, not a measurement"
        for why, count in counted(map(not_a_measurement, results))
    ]
    problems += [
        f"{count} run(s) are on {why}: {CANNOT_RANK}" for why, count in counted(map(cannot_rank, results))
    ]
    rows = []
    for key in sorted(set(one) & set(published)):
        dataset, n_tasks, label = key
        seeds = sorted(set(one[key]) & set(published[key]))
        if not seeds:
            problems.append(f"{label} / {dataset} / T={n_tasks}: no seed run under both protocols")
            continue
        # [S, T, 1] fractions: the bootstrap's stage scores are percentages of its values
        stages = np.stack([published[key][s].stage_accuracy - one[key][s].stage_accuracy for s in seeds])
        everything = np.ones((stages.shape[1], 1), bool)
        replicates = (
            bootstrap_stage_means(stages[:, :, None] / 100.0, everything, draws, resample_images=False)
            if len(seeds) > 1
            else None
        )
        row = {"strategy": label, "dataset": dataset, "tasks": n_tasks, "n": len(seeds)}
        for metric, (field, name) in METRICS.items():
            if metric in TASK_METRICS:  # this table is about accuracy: Last and Avg
                continue
            short = name.split()[0]
            before = [one[key][s].result.summary[field] for s in seeds]
            after = [published[key][s].result.summary[field] for s in seeds]
            row[f"{short} one-protocol"] = _cell(before)
            row[f"{short} as-published"] = _cell(after)
            estimate = float(np.mean(np.subtract(after, before)))
            if replicates is None:
                row[f"Δ {short} [95 % CI]"] = f"{estimate:+.2f} {MISSING}"
            else:
                ci = interval(estimate, metric_of_stages(replicates, metric))
                row[f"Δ {short} [95 % CI]"] = f"{estimate:+.2f} [{ci.low:+.2f}, {ci.high:+.2f}]"
        rows.append(row)
    if not rows:
        raise UserError(
            f"no strategy, dataset and task count was run under both protocols ({one_protocol_dir}, "
            f"{as_published_dir}); run main and main-as-published with the same seeds"
        )
    return pd.DataFrame(rows), problems


def write_protocol_effect(frame: pd.DataFrame, out_dir: Path, notes: Sequence[str] = ()) -> list[Path]:
    """``protocol_effect.md`` (with the notes), ``.csv`` and ``.tex`` in ``out_dir``."""
    title = "How much the protocol moves each row (as-published minus one protocol, percentage points)"
    cells = frame.set_index("strategy")
    markdown = "\n".join(
        [f"## {title}", "", markdown_table(cells, index_name="strategy"), *(f"- {n}" for n in notes)]
    )
    paths = [out_dir / f"{TABLE}.{ext}" for ext in ("md", "csv", "tex")]
    texts = [
        markdown + "\n",
        frame.to_csv(index=False),
        latex_table(cells.astype(str), index_name="strategy"),
    ]
    for path, text in zip(paths, texts):
        atomic_write_text(path, text)
    return paths


@one_line_user_errors
def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="python -m analysis.protocol_effect", description=__doc__.split("\n")[0])
    parser.add_argument("--one-protocol", required=True, help="results of the one-protocol suite (runs/main)")
    parser.add_argument("--as-published", required=True, help="results of main-as-published")
    parser.add_argument("--out", help="folder for the table (default: the --as-published folder)")
    parser.add_argument("--draws", type=int, default=DRAWS, help=f"bootstrap replicates (default {DRAWS})")
    args = parser.parse_args(argv)
    check_draws(args.draws)
    out = output_folder(args.out or args.as_published, "--out" if args.out else "--as-published")
    frame, notes = protocol_effect(args.one_protocol, args.as_published, args.draws)
    for line in notes:
        print(f"note: {line}", file=sys.stderr)
    with one_line_storage_errors("write the table", "free space, fix permissions or give another --out"):
        paths = write_protocol_effect(frame, out, notes)
    print(markdown_table(frame.set_index("strategy"), index_name="strategy"), end="")
    print(f"wrote {len(paths)} files to {paths[0].parent}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
