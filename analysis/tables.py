"""Avg/Last accuracy, forgetting and BWT tables from result JSON: ``python -m analysis.tables
--results-dir DIR``.

Cells are mean ± std over seeds (population std, ddof=0; a single seed shows "(n = 1)"). Rows are
strategies (or variant labels), columns are datasets (with the task count when several appear, and
a half-base split always: "cifar100 (B50 Inc10)"),
each with Avg, Last, Forgetting and BWT (``benchmarks.core.metrics``; "–" with one task).
The Markdown goes to stdout; ``table.md``, ``table.csv`` and ``table.tex`` are written next to
the results.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pandas as pd

from analysis.formatting import latex_table, markdown_table, mean_std_cell, population_std
from benchmarks.core.atomic_io import atomic_write_text
from benchmarks.core.errors import CommandParser, UserError, one_line_user_errors
from benchmarks.data.streams import tasks_label
from benchmarks.runner.reading import Results, not_a_measurement, read_results, skipped_clause
from benchmarks.runner.results import RunKey, RunResult


def summary_row(result: RunResult) -> dict:
    """A run's row of the table's frame: its key, whether it is no measurement, its summary."""
    return {
        "label": result.label,
        "dataset": result.dataset,
        "n_tasks": result.n_tasks,
        "split": result.config.get("split", ""),  # a half-base run is never grouped with equal tasks
        "seed": result.seed,
        "not_a_measurement": not_a_measurement(result),
        **result.summary,
    }


def load_runs(
    results_dir: str | Path | Results,
    keys: list[RunKey] | None = None,
    notes: list[str] | None = None,
) -> pd.DataFrame:
    """One row per run (label, dataset, n_tasks, seed) with the summary metrics: one result per run
    key, by ``Results``' rule. ``notes`` receives what the reader should be told (skipped
    files, keys that several results share); without it, each is a warning."""
    results = read_results(results_dir)
    wanted = set(keys) if keys is not None else None
    for note in results.notes:
        notes.append(note) if notes is not None else warnings.warn(note, stacklevel=2)
    rows = [summary_row(file.result) for file in results.runs if wanted is None or file.key in wanted]
    return pd.DataFrame(rows)


#: what a cell gathers the seeds of: a half-base split is its own cell
GROUP = ("label", "dataset", "n_tasks", "split")


def _with_split(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with a ``split`` column ("" for equal tasks) where its rows were made without one."""
    return runs if "split" in runs else runs.assign(split="")


#: the summary entries of the table, by column name
TABLE_METRICS = {"avg_acc": "Avg", "last_acc": "Last", "forgetting": "Forgetting", "bwt": "BWT"}


def aggregate(runs: pd.DataFrame, metrics=tuple(TABLE_METRICS)) -> pd.DataFrame:
    """Mean and std over seeds per (label, dataset, n_tasks, split)."""
    # None (forgetting with one task) as NaN: left out of the mean, the std and the count
    numbers = runs.reindex(columns=list(metrics)).apply(pd.to_numeric).astype(float)
    keyed = pd.concat([_with_split(runs)[list(GROUP)], numbers], axis=1)
    grouped = keyed.groupby(list(GROUP), sort=False)[list(metrics)]
    return grouped.agg(["mean", population_std, "count"]).rename(columns={"population_std": "std"}, level=1)


def accuracy_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Rows = labels, columns = (dataset, Avg|Last|Forgetting|BWT), cells = 'mean ± std'."""
    stats = aggregate(runs)
    runs = _with_split(runs)
    several_t = runs["n_tasks"].nunique() > 1 or runs["split"].astype(bool).any()
    cells = {}
    for (label, dataset, n_tasks, split), row in stats.iterrows():
        column = f"{dataset} ({tasks_label(n_tasks, split)})" if several_t else dataset
        for metric, name in TABLE_METRICS.items():
            cells.setdefault(label, {})[(column, name)] = mean_std_cell(
                row[(metric, "mean")], row[(metric, "std")], n=row[(metric, "count")]
            )
    table = pd.DataFrame.from_dict(cells, orient="index").fillna("–")  # a run that does not exist
    table.columns = pd.MultiIndex.from_tuples(table.columns, names=["dataset", "metric"])
    table.index.name = "method"
    return table


def to_markdown(table: pd.DataFrame) -> str:
    return markdown_table(table, index_name="method")


def seeds_note(runs: pd.DataFrame) -> str:
    """The line under the Markdown table that gives n, which a ``mean ± std`` cell does not show."""
    counts = _with_split(runs).groupby(list(GROUP)).size()
    low, high = int(counts.min()), int(counts.max())
    n = (
        f"n = {low} seed{'s' if low > 1 else ''} in every cell"
        if low == high
        else f"n = {low} to {high} seeds a cell"
    )
    return (
        f"Avg, Last: accuracy (%); Forgetting (lower is better), BWT (backward transfer, negative when "
        f"later tasks cost earlier ones): points of accuracy. Mean ± population std over seeds; {n}."
    )


def check_only_note(runs: pd.DataFrame) -> str:
    """A line that says when runs are fast dev runs or on fake data: checks, not measurements."""
    flagged = runs["not_a_measurement"].dropna() if "not_a_measurement" in runs else pd.Series(dtype=str)
    if flagged.empty:
        return ""
    kinds = " and ".join(sorted(set(flagged)))
    return (
        f"**Not measurements**: {len(flagged)} of {len(runs)} runs are {kinds} (a check that every code "
        "path runs, on a few images), never to be read or reported as results.\n"
    )


def to_latex(table: pd.DataFrame) -> str:
    """Booktabs LaTeX; names are escaped and ``±`` becomes ``$\\pm$``."""
    return latex_table(table, index_name="method")


def write_tables(results_dir: str | Path, keys: list[RunKey] | None = None) -> str:
    """Write table.md/.csv/.tex into ``results_dir`` and return the Markdown."""
    results_dir = Path(results_dir)
    runs = load_runs(results_dir, keys, notes := [])
    if runs.empty:
        raise UserError(
            f"no result JSON found under {results_dir}{skipped_clause(notes)}; run python -m "
            "benchmarks.run first or point --results-dir at a folder of results"
        )
    table = accuracy_table(runs)
    notes_text = "".join(f"Note: {note}\n" for note in notes)
    markdown = f"{to_markdown(table)}\n{seeds_note(runs)}\n{check_only_note(runs)}{notes_text}"
    atomic_write_text(results_dir / "table.md", markdown)
    atomic_write_text(results_dir / "table.csv", table.to_csv())
    atomic_write_text(results_dir / "table.tex", to_latex(table))
    return markdown


@one_line_user_errors
def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="python -m analysis.tables", description=__doc__.split("\n")[0])
    parser.add_argument("--results-dir", required=True, help="folder of result JSON (searched recursively)")
    args = parser.parse_args(argv)
    print(write_tables(args.results_dir), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
