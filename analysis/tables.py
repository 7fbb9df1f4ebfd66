"""Avg/Last accuracy, forgetting and BWT tables from result JSON: ``python -m analysis.tables
--results-dir DIR``.

Cells are mean ± std over seeds (population std, ddof=0; a single seed shows "(n = 1)"). Rows are
strategies (or variant labels), columns are datasets (with the task count when several appear, and
a half-base split always: "cifar100 (B50 Inc10)"),
each with Avg, Last, Forgetting and BWT (``benchmarks.core.metrics``; "–" with one task).
A table never averages over class orders: where some method ran a dataset and task count in several
orders (a suite that lists them), that column is split by order, ``cifar100 (order seed0)``, each
cell over its order's seeds; ``python -m analysis.compare`` pools the (order, seed) units, with
intervals and the share of the variance between orders.
The Markdown goes to stdout; ``table.md``, ``table.csv`` and ``table.tex`` are written next to
the results.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.formatting import latex_table, markdown_table, mean_std_cell, population_std
from benchmarks.core.atomic_io import atomic_write_text
from benchmarks.core.errors import CommandParser, UserError, one_line_user_errors, results_folder
from benchmarks.data.splits import tasks_label
from benchmarks.runner.reading import (
    CANNOT_RANK,
    Results,
    cannot_rank,
    not_a_measurement,
    read_results,
    skipped_clause,
)
from benchmarks.runner.result_record import RunResult
from benchmarks.runner.results import RunKey


def summary_row(result: RunResult) -> dict:
    """A run's row of the table's frame: its key, whether it is no measurement, its summary."""
    return {
        "label": result.label,
        "dataset": result.dataset,
        "n_tasks": result.n_tasks,
        "split": result.config.get("split", ""),  # a half-base run is never grouped with equal tasks
        "seed": result.seed,
        "order": str(result.config.get("class_order") or ""),  # the class order's name
        "default_order": result.key.order == "",  # its protocol's default: the first of its columns
        "not_a_measurement": not_a_measurement(result),
        "cannot_rank": cannot_rank(result),
        "tuned": bool(result.config.get("tuned")),  # its options came from benchmarks.tune
        **result.summary,
    }


def load_runs(
    results_dir: str | Path | Results,
    keys: list[RunKey] | None = None,
    notes: list[str] | None = None,
) -> pd.DataFrame:
    """One row per run (label, dataset, n_tasks, seed, order) with the summary metrics: one result per run
    key, by ``Results``' rule. ``notes`` receives what the reader should be told (skipped
    files, keys that several results share); without it, each is a warning."""
    results = read_results(results_dir)
    wanted = set(keys) if keys is not None else None
    for note in results.notes:
        notes.append(note) if notes is not None else warnings.warn(note, stacklevel=2)
    rows = [summary_row(file.result) for file in results.runs if wanted is None or file.key in wanted]
    return pd.DataFrame(rows)


#: the summary entries of the table, by column name
TABLE_METRICS = {"avg_acc": "Avg", "last_acc": "Last", "forgetting": "Forgetting", "bwt": "BWT"}


#: what a cell's seeds share: a half-base split and a class order are cells of their own
CELL = ["label", "dataset", "n_tasks", "split", "order"]


def _with_order(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with ``split`` and ``order`` columns (frames made without them: equal tasks, one order)."""
    missing = {column: "" for column in ("split", "order") if column not in runs}
    return runs.assign(**missing) if missing else runs


def aggregate(runs: pd.DataFrame, metrics=tuple(TABLE_METRICS)) -> pd.DataFrame:
    """Mean and std over seeds per (label, dataset, n_tasks, split, class order)."""
    runs = _with_order(runs)
    # None (forgetting with one task) as NaN: left out of the mean, the std and the count
    numbers = runs.reindex(columns=list(metrics)).apply(pd.to_numeric).astype(float)
    keyed = pd.concat([runs[CELL], numbers], axis=1)
    grouped = keyed.groupby(CELL, sort=False)[list(metrics)]
    return grouped.agg(["mean", population_std, "count"]).rename(columns={"population_std": "std"}, level=1)


def split_by_order(runs: pd.DataFrame) -> set[tuple[str, int, str]]:
    """The (dataset, n_tasks, split) columns that some label ran in more than one class order: split
    by order."""
    orders = _with_order(runs).groupby(["label", "dataset", "n_tasks", "split"])["order"].nunique()
    return {(dataset, n_tasks, split) for (_, dataset, n_tasks, split), n in orders.items() if n > 1}


def accuracy_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Rows = labels, columns = (dataset, Avg|Last|Forgetting|BWT), cells = 'mean ± std'; a column
    that some label ran in several class orders is one column per order (``split_by_order``)."""
    stats = aggregate(runs)
    runs = _with_order(runs)
    several_t = bool(runs["n_tasks"].nunique() > 1 or runs["split"].astype(bool).any())
    by_order = split_by_order(runs)
    default = set(runs.query("default_order")["order"]) if "default_order" in runs else set()
    cells: dict[str, dict[tuple[str, str], str]] = {}
    place: dict[Any, tuple] = {}  # a dataset's key, and each column: where it goes
    for (label, dataset, n_tasks, split, order), row in stats.iterrows():
        shown = [tasks_label(n_tasks, split)] * several_t
        shown += [f"order {order}"] * ((dataset, n_tasks, split) in by_order)
        column = f"{dataset} ({', '.join(shown)})" if shown else dataset
        # a dataset's columns where it first appears; its orders the default first, then by name
        first = place.setdefault((dataset, n_tasks, split), (len(place),))[0]
        place.setdefault(column, (first, order not in default, order))
        for metric, name in TABLE_METRICS.items():
            cells.setdefault(label, {})[(column, name)] = mean_std_cell(
                row[(metric, "mean")], row[(metric, "std")], n=row[(metric, "count")]
            )
    table = pd.DataFrame.from_dict(cells, orient="index").fillna("–")  # a run that does not exist
    table.index = [f"{label}{TUNED_MARK}" if label in tuned_labels(runs) else label for label in table.index]
    table = table[sorted(table.columns, key=lambda column: place[column[0]])]  # stable: metrics in order
    table.columns = pd.MultiIndex.from_tuples(table.columns, names=["dataset", "metric"])
    table.index.name = "method"
    return table


#: how a table marks a row whose options came from a tune (``config.tuned``)
TUNED_MARK = " (tuned)"


def tuned_labels(runs: pd.DataFrame) -> set[str]:
    """The labels of which some run took its options from ``benchmarks.tune``."""
    return set(runs.loc[runs["tuned"].astype(bool), "label"]) if "tuned" in runs else set()


def tuned_note(runs: pd.DataFrame) -> str:
    """A line that says what a "(tuned)" row is, where the table has one."""
    if not (labels := tuned_labels(runs)):
        return ""
    return (
        f"Rows marked{TUNED_MARK} ({', '.join(sorted(labels))}) took their options from python -m "
        "benchmarks.tune, chosen on a validation split held out of the training images; the test set "
        "chose nothing. Set against an untuned row, the difference includes what the tuning bought.\n"
    )


def to_markdown(table: pd.DataFrame) -> str:
    return markdown_table(table, index_name="method")


def seeds_note(runs: pd.DataFrame) -> str:
    """The line under the Markdown table that gives n, which a ``mean ± std`` cell does not show;
    and, where columns are split by class order, that they are."""
    counts = _with_order(runs).groupby(CELL).size()
    low, high = int(counts.min()), int(counts.max())
    n = (
        f"n = {low} seed{'s' if low > 1 else ''} in every cell"
        if low == high
        else f"n = {low} to {high} seeds a cell"
    )
    orders = ""
    if split := split_by_order(runs):
        columns = ", ".join(f"{dataset} ({tasks_label(n, tasks)})" for dataset, n, tasks in sorted(split))
        orders = (
            f" Several class orders were run on {columns}: one column per order, over its seeds; "
            "python -m analysis.compare pools the (order, seed) units, with intervals."
        )
    return (
        f"Avg, Last: accuracy (%); Forgetting (lower is better), BWT (backward transfer, negative when "
        f"later tasks cost earlier ones): points of accuracy. Mean ± population std over seeds; {n}.{orders}"
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


def cannot_rank_note(runs: pd.DataFrame) -> str:
    """A line that says when runs are on the synthetic world, the tiny CLIP or random weights."""
    flagged = runs["cannot_rank"].dropna() if "cannot_rank" in runs else pd.Series(dtype=str)
    if flagged.empty:
        return ""
    kinds = " and ".join(sorted(set(flagged)))
    return f"**Not a ranking**: {len(flagged)} of {len(runs)} runs are on {kinds}: {CANNOT_RANK}.\n"


def to_latex(table: pd.DataFrame) -> str:
    """Booktabs LaTeX; names are escaped and ``±`` becomes ``$\\pm$``."""
    return latex_table(table, index_name="method")


def write_tables(results_dir: str | Path, keys: list[RunKey] | None = None) -> str:
    """Write table.md/.csv/.tex into ``results_dir`` and return the Markdown."""
    results_dir = results_folder(results_dir)
    notes: list[str] = []
    runs = load_runs(results_dir, keys, notes)
    if runs.empty:
        raise UserError(
            f"no result JSON found under {results_dir}{skipped_clause(notes)}; run python -m "
            "benchmarks.run first or point --results-dir at a folder of results"
        )
    table = accuracy_table(runs)
    notes_text = "".join(f"Note: {note}\n" for note in notes)
    caveats = f"{tuned_note(runs)}{check_only_note(runs)}{cannot_rank_note(runs)}{notes_text}"
    markdown = f"{to_markdown(table)}\n{seeds_note(runs)}\n{caveats}"
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
