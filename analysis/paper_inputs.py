"""What the paper tables and figures read: the results of a folder, the paper's published numbers,
and the names both use for datasets and methods.

``load_inputs`` reads a results folder into ``ReportInputs``; ``load_paper_reference`` reads the
paper's numbers from ``results/reference/paper_tables.csv``: one line per printed number, with the
tex label of its source table (``source``), the report table it belongs to (``table``), the row as
the paper prints it, and ``group`` / ``metric`` ids matching the report's columns. A report row
meets its paper row through ``PAPER_METHOD_NAMES`` or an equal name (``match_paper_row``).

A table or figure that cannot be made from the results at hand raises ``MissingInputs``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from benchmarks.core.errors import UserError, results_folder
from benchmarks.data.unit import dataset_units
from benchmarks.runner.reading import (
    CANNOT_RANK,
    Results,
    cannot_rank,
    counted,
    figure_caveat,
    not_a_measurement,
    protocol_of,
    read_results,
    skipped_clause,
)
from benchmarks.runner.result_record import RunResult
from benchmarks.runner.results import RunKey
from strategies.cards import cards

REFERENCE_FILE = Path(__file__).resolve().parents[1] / "results" / "reference" / "paper_tables.csv"

#: each dataset's name in tables and figures: its unit's ``title`` (``benchmarks/data/units/``)
DATASET_NAMES = {name: unit.title for name, unit in dataset_units().items()} | {"average": "Average"}
PAPER_DATASETS = ("cifar100", "imagenet_r", "imagenet100", "imagenet1k")

# Our labels whose paper row has another name (each method's card: strategies/methods/<name>.toml);
# other labels match a paper row when they agree ignoring case and punctuation (``mg_clip`` ~ ``MG-CLIP``).
PAPER_METHOD_NAMES = {name: card.paper_row for name, card in cards().items() if card.paper_row}
PAPER_ROW_ALIASES = {"Ours": "GR4CIL (Ours)"}  # Table 2 prints "Ours"
# How a strategy's row is labelled in the report's tables and figures (its card's title,
# docs/decisions.md D9); other run labels (suite variants, a user's strategy) are shown as they are.
ROW_LABELS = {name: card.title for name, card in cards().items()}


class MissingInputs(Exception):
    """A table or figure cannot be made from the results at hand; the message says why."""


# ============================================================================ results
@dataclass
class ReportInputs:
    """Finished results of one results folder, as typed records.

    ``runs`` has one result per (label, dataset, n_tasks, seed): when several files share a key
    (e.g. a main-protocol run and a zero-shot run with held-out images), the one without
    ``zero_shot`` is kept (``read_results`` refuses any other pair). ``all_runs`` keeps every
    distinct run. Both hold the runs of one class order a method, dataset and task count: the
    protocol's default where it was run (as the paper's numbers were made), else the first by
    name; ``every_order`` holds the runs of every order (``analysis.orders.fig_class_orders`` reads it).
    """

    runs: list[RunResult]
    all_runs: list[RunResult]
    notes: list[str] = field(default_factory=list)
    loaded: Results | None = None  # what was read, for the report's other readers
    paths: dict[RunKey, Path] = field(default_factory=dict)  # the file each of ``runs`` was read from
    every_order: list[RunResult] = field(default_factory=list)  # ``runs`` and those of other class orders

    @property
    def caveat(self) -> str | None:
        """The line every figure of these runs carries where they cannot rank methods."""
        return figure_caveat(self.all_runs)


def load_inputs(results_dir: str | Path | Results) -> ReportInputs:
    """The finished results under ``results_dir`` (a folder, or what ``read_results`` read from
    one), one per run key by ``Results``' rule; a ``UserError`` when there are none."""
    if not isinstance(results_dir, Results):
        results_folder(results_dir)
    loaded = read_results(results_dir)
    # a paper table holds one protocol: as-published runs are read by the protocol table only
    one_protocol = loaded.where(lambda file: protocol_of(file.result) != "as-published")
    notes = list(loaded.skipped)
    if len(one_protocol) < len(loaded):
        notes.append(
            f"{len(loaded) - len(one_protocol)} as-published result(s) left out of the paper tables "
            "(one protocol each); python -m analysis.report --as-published DIR compares them"
        )
    if not len(one_protocol):
        raise UserError(
            f"no result JSON {'of this schema ' if notes else ''}found under {results_dir}"
            f"{skipped_clause(loaded.skipped)}; "
            "run python -m benchmarks.run first "
            "or point --results-dir at a folder of results"
        )
    every_order = [file.result for file in one_protocol.runs]
    # a paper table holds one class order, the paper's where it was run: other orders are read by
    # the order figure and the comparison against GR4CIL, which pair them over (order, seed)
    table_order: dict[tuple, str] = {}
    for file in sorted(one_protocol.found, key=lambda file: (file.key.order != "", file.key.order)):
        key = file.key
        table_order.setdefault((key.label, key.dataset, key.split, key.n_tasks), key.order)
    one_order = one_protocol.where(
        lambda file: (
            table_order[file.key.label, file.key.dataset, file.key.split, file.key.n_tasks] == file.key.order
        )
    )
    if len(one_order) < len(one_protocol):
        notes.append(
            f"{len(one_protocol) - len(one_order)} result(s) in another class order left out of the paper "
            "tables and figures, which read one order a method, dataset and task count (the protocol's "
            "default where it ran); fig_class_orders and the comparison against GR4CIL read every order"
        )
    one_protocol = one_order
    distinct = [file.result for file in one_protocol.distinct]
    caveats = [why for run in distinct if (why := not_a_measurement(run))]
    notes += [
        f"{caveats.count(why)} result(s) are {why}: a check of the code path, not a measurement; "
        "never report these tables"
        for why in sorted(set(caveats))
    ]
    notes += [
        f"{count} result(s) are on {why}: {CANNOT_RANK}" for why, count in counted(map(cannot_rank, distinct))
    ]
    notes += one_protocol.duplicate_notes
    runs = [file.result for file in one_protocol.runs]
    paths = {file.key: file.path for file in one_protocol.runs}
    return ReportInputs(runs, distinct, notes, loaded, paths, every_order)


def split_of(run: RunResult) -> str:
    """``""`` for equal tasks, else the run's half-base split (``config.split``): a B50-Inc10 run of
    6 tasks is never taken for one of 6 equal tasks."""
    return run.config.get("split", "")


# ============================================================================ names
def ordered_datasets(names, first=PAPER_DATASETS) -> list[str]:
    """The paper's datasets in the paper's order, then any others alphabetically."""
    names = set(names)
    return [d for d in first if d in names] + sorted(names - set(first))


def dataset_name(dataset: str) -> str:
    """A dataset's title; a unit registered after this module was imported is looked up again."""
    if dataset in DATASET_NAMES:
        return DATASET_NAMES[dataset]
    unit = dataset_units().get(dataset)
    return unit.title if unit is not None else dataset


def row_label(label: str) -> str:
    """The report's name for run label ``label``: the paper's row label (D9) where it has one."""
    return ROW_LABELS.get(label, label)


# ============================================================================ the paper's numbers
def _normalise(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def match_paper_row(row: str, paper_rows: list[str]) -> str | None:
    """The paper row that a report row corresponds to, or None."""
    wanted = PAPER_METHOD_NAMES.get(row, row)
    if wanted in paper_rows:
        return wanted
    by_key = {_normalise(p): p for p in paper_rows}
    return by_key.get(_normalise(wanted))


def load_paper_reference(path: str | Path = REFERENCE_FILE) -> pd.DataFrame:
    """The paper's numbers: columns source, table, row, group, metric, value, std, note, with
    ``row`` mapped to one name per method (Table 2's "Ours" is "GR4CIL (Ours)")."""
    frame = pd.read_csv(
        path, dtype={"row": str, "note": str}, keep_default_na=False, na_values={"value": [""], "std": [""]}
    )
    frame["value"] = frame["value"].astype(float)
    frame["std"] = frame["std"].astype(float)
    frame["row"] = frame["row"].map(lambda r: PAPER_ROW_ALIASES.get(r, r))
    return frame
