"""The paper's tables built from result JSON, with the paper's published numbers beside them.

Each ``table_*`` builder takes the loaded results (``ReportInputs``) and returns a ``ReportTable``,
or raises ``MissingInputs`` with a one-line reason. A ``ReportTable`` holds the per-seed values of
every cell in long form (``row, group, metric, seed, value``); cells are mean ± std over seeds
(population std, as in ``analysis.tables``).

Which runs feed which table:

* Rows named by run *label* (so a new strategy is one more row, with no code change):
  ``table1_main``, ``table2_seq``, ``table2_ood``, ``table_anchor``.
* Rows found from the resolved GR4CIL config, never from labels: ``table4_ablation``,
  ``table5_compensation``, ``table_adjacent_subspace``, ``table_tau``, ``table_beta_gamma``; and the
  diagnostics of the default configuration: ``table3_subspace``. Settings are compared after
  dropping switches that a disabled component ignores (e.g. ``tau`` without ``L_sep``), and the
  ablation tables show only datasets where some run differs from the defaults.
  ``threshold_holdout`` counts as a switch: zero-shot runs trained on fewer images are no ablation row.
* ``table3_zeroshot`` reads the ``zero_shot`` key of zero-shot runs.

All tables except ``table2_seq`` use 10-task runs, as in the paper. Bold / italic mark the best /
second-best reproduced entry of each column (paper rows are reference only and never marked);
higher is better except for the metrics in ``LOWER_IS_BETTER`` (subspace distances).

The paper's numbers live in ``results/reference/paper_tables.csv``: one line per printed number,
with the tex label of its source table (``source``), the report table it belongs to (``table``),
the row as the paper prints it, and ``group`` / ``metric`` ids matching the report's columns.
A report row meets its paper row through ``PAPER_METHOD_NAMES`` or an equal name; each gets a
"[paper]" row and a "Δ" row (reproduced mean minus paper) right below it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from analysis.formatting import (
    latex_escape,
    latex_table,
    markdown_table,
    mean_std_cell,
    population_std,
    rank_marks,
    signed_cell,
)
from benchmarks.core.errors import UserError
from benchmarks.runner.results import iter_results, not_a_measurement

REFERENCE_FILE = Path(__file__).resolve().parents[1] / "results" / "reference" / "paper_tables.csv"

DATASET_NAMES = {
    "cifar100": "CIFAR-100",
    "imagenet_r": "ImageNet-R",
    "imagenet100": "ImageNet-100",
    "imagenet1k": "ImageNet-1K",
    "pets": "Pets",
    "food101": "Food-101",
    "average": "Average",
}
PAPER_DATASETS = ("cifar100", "imagenet_r", "imagenet100", "imagenet1k")
ZERO_SHOT_TARGETS = ("pets", "food101", "imagenet1k")
ZERO_SHOT_ROWS = {"cifar100": "GR4CIL i", "imagenet_r": "GR4CIL ii"}  # the paper's names by training set

METRIC_NAMES = {
    "avg_acc": "Avg-Acc",
    "last_acc": "Last-Acc",
    "avg_auroc": "Avg-AUROC",
    "last_auroc": "Last-AUROC",
    "last_routing_acc": "Last-Routing Acc",
    "last_acc_T5": "5-task",
    "last_acc_T20": "20-task",
    "adjacent_compensation_distance": "Compensation-space distance",
    "adjacent_text_distance": "Text-space distance",
    "distance": "",
    "acc": "",
    "anchor_preservation": "",
}
# Distances: a smaller value means closer subspaces, so the smallest is best.
LOWER_IS_BETTER = frozenset({"distance", "adjacent_compensation_distance", "adjacent_text_distance"})

# Our labels whose paper row has another name; other labels match a paper row when they agree
# ignoring case and punctuation (``mg_clip`` ~ ``MG-CLIP``).
PAPER_METHOD_NAMES = {
    "gr4cil": "GR4CIL (Ours)",
    "continual_clip": "Continual-CLIP",  # docs/decisions.md D9
    "adaptervlm": "AdapterVLM",
    "mg_clip": "MG-CLIP",
    "moe4cl": "MOE4CL",
    "magmax": "MagMax",
    "l2p_pp": "L2P++",
    "dualprompt": "DualPrompt",
    "coda_prompt": "CODA",
    "aper_adapter": "Aper-Adapter",
    "clap": "CLAP",
}
PAPER_ROW_ALIASES = {"Ours": "GR4CIL (Ours)"}  # Table 2 prints "Ours"
# How a strategy's row is labelled in the report's tables and figures (docs/decisions.md D9); other run
# labels (suite variants, a user's strategy) are shown as they are.
ROW_LABELS = {**PAPER_METHOD_NAMES, "gr4cil": "GR4CIL", "finetune": "Fine-tuning"}


def row_label(label: str) -> str:
    """The report's name for run label ``label``: the paper's row label (D9) where it has one."""
    return ROW_LABELS.get(label, label)


# GR4CIL's defaults for every switch the ablations vary (``strategies.gr4cil.GR4CILConfig``; a
# test keeps the two in step). A run whose setting equals this is "the default configuration".
# Like epochs and lr, ``visual_init`` belongs to a suite's training recipe, not to the paper's
# ablation switches (docs/decisions.md P2), so it does not decide a run's row (the smoke uses "fresh").
GR4CIL_DEFAULTS = {
    "use_anchor_loss": True,
    "use_separation_loss": True,
    "lambda_anc": 1.0,
    "lambda_sep": 1.0,
    "tau": 0.7,
    "compensation": "orthogonal",
    "compensation_init": "prototype",
    "use_prototype_score": True,
    "beta": 0.2,
    "gamma": 0.2,
    "threshold_holdout": 0.0,
}


class MissingInputs(Exception):
    """A table or figure cannot be made from the results at hand; the message says why."""


# ============================================================================ loading
@dataclass
class ReportInputs:
    """Finished results of one results folder.

    ``runs`` has one result per (label, dataset, n_tasks, seed): when several files share a key
    (e.g. a main-protocol run and a zero-shot run with held-out images), the one without
    ``zero_shot`` is kept, then the first by path. ``all_runs`` keeps every distinct run.
    """

    runs: list[dict]
    all_runs: list[dict]
    notes: list[str] = field(default_factory=list)


def load_inputs(results_dir: str | Path) -> ReportInputs:
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise UserError(f"results folder {results_dir} does not exist; give the --results-dir of a run")
    skipped: list[str] = []
    found = [dict(result, _path=str(path)) for path, result in iter_results(results_dir, skipped)]
    # a paper table holds one protocol: as-published runs are read by the protocol table only
    as_published = [r for r in found if r["config"].get("protocol") == "as-published"]
    found = [r for r in found if r["config"].get("protocol") != "as-published"]
    if as_published:
        skipped.append(
            f"{len(as_published)} as-published result(s) left out of the paper tables "
            "(one protocol each); python -m analysis.report --as-published DIR compares them"
        )
    if not found:
        raise UserError(
            f"no result JSON {'of this schema ' if skipped else ''}found under {results_dir}; "
            "run python -m benchmarks.run first "
            "or point --results-dir at a folder of results"
        )
    distinct, seen = [], set()
    for run in found:  # the same run copied twice (same key, same config) counts once
        ident = (*_key(run), run.get("config_hash"))
        if ident not in seen:
            seen.add(ident)
            distinct.append(run)
    by_key: dict[tuple, list[dict]] = {}
    for run in sorted(distinct, key=lambda r: ("zero_shot" in r, r["_path"])):
        by_key.setdefault(_key(run), []).append(run)
    caveats = [why for run in distinct if (why := not_a_measurement(run))]
    notes = [
        f"{caveats.count(why)} result(s) are {why}: a check of the code path, not a measurement; "
        "never report these tables"
        for why in sorted(set(caveats))
    ]
    notes += [
        f"{len(group)} results for {group[0]['label']} / {group[0]['dataset']} / T={group[0]['n_tasks']} / "
        f"seed {group[0]['seed']} with different configs; tables use {group[0]['_path']}"
        for group in by_key.values()
        if len(group) > 1
    ]
    return ReportInputs([group[0] for group in by_key.values()], distinct, skipped + notes)


def _key(run: dict) -> tuple:
    return run["label"], run["dataset"], run["n_tasks"], run["seed"]


def ordered_datasets(names, first=PAPER_DATASETS) -> list[str]:
    """The paper's datasets in the paper's order, then any others alphabetically."""
    names = set(names)
    return [d for d in first if d in names] + sorted(names - set(first))


def dataset_name(dataset: str) -> str:
    return DATASET_NAMES.get(dataset, dataset)


# ============================================================================ GR4CIL settings
def gr4cil_setting(run: dict) -> dict | None:
    """The run's ablation switches with those a disabled component ignores set to None, or
    None for a run of another strategy."""
    if run.get("strategy") != "gr4cil":
        return None
    options = run.get("config", {}).get("strategy_config", {})
    return effective_setting({k: options.get(k, v) for k, v in GR4CIL_DEFAULTS.items()})


def effective_setting(setting: dict) -> dict:
    setting = dict(setting)
    if not setting["use_anchor_loss"]:
        setting["lambda_anc"] = None
    if not setting["use_separation_loss"]:
        setting["tau"] = setting["lambda_sep"] = None
    if setting["compensation"] == "off":
        setting["compensation_init"] = setting["beta"] = None
    if not setting["use_prototype_score"]:
        setting["gamma"] = None
    return setting


def differing_switches(run: dict) -> set[str] | None:
    """Names of the switches where a GR4CIL run differs from the defaults (None: not GR4CIL)."""
    setting = gr4cil_setting(run)
    if setting is None:
        return None
    default = effective_setting(GR4CIL_DEFAULTS)
    return {k for k in default if setting[k] != default[k]}


def matches(run: dict, overrides: dict) -> bool:
    """Whether a GR4CIL run has exactly the default setting changed by ``overrides``."""
    setting = gr4cil_setting(run)
    return setting is not None and setting == effective_setting({**GR4CIL_DEFAULTS, **overrides})


def default_gr4cil_runs(inputs: ReportInputs, n_tasks: int | None = 10) -> list[dict]:
    """GR4CIL runs in the default configuration, one per (dataset, n_tasks, seed)."""
    runs = [r for r in inputs.runs if matches(r, {}) and (n_tasks is None or r["n_tasks"] == n_tasks)]
    return _first_per(runs, lambda r: (r["dataset"], r["n_tasks"], r["seed"]))


def _first_per(items: list, ident: Callable) -> list:
    """The first item of each ``ident`` value. Two labels may run the identical configuration
    (e.g. a main run and the "full" row of an ablation suite); such a seed must count once."""
    kept, seen = [], set()
    for item in items:
        if ident(item) not in seen:
            seen.add(ident(item))
            kept.append(item)
    return kept


# ============================================================================ the table object
@dataclass
class ReportTable:
    """One report table: per-seed cell values plus how to lay them out."""

    name: str
    title: str
    samples: pd.DataFrame  # columns row, group, metric, seed, value
    rows: list[str]
    columns: list[tuple[str, str]]  # (group, metric) ids in display order
    row_header: str = "method"
    decimals: int = 2
    metric_names: dict = field(default_factory=dict)  # (group, metric) or metric -> header
    no_paper_columns: set = field(default_factory=set)  # columns whose paper number does not apply

    def stats(self) -> pd.DataFrame:
        """Mean, population std and seed count per (row, group, metric)."""
        grouped = self.samples.groupby(["row", "group", "metric"])["value"]
        return grouped.agg(mean="mean", std=population_std, n="count")

    def header(self, column: tuple[str, str]) -> tuple[str, str]:
        group, metric = column
        name = self.metric_names.get(column, self.metric_names.get(metric, METRIC_NAMES.get(metric, metric)))
        return dataset_name(group), name

    def lower_is_better(self, column: tuple[str, str]) -> bool:
        return column[1] in LOWER_IS_BETTER

    def render(self, paper: pd.DataFrame | None = None) -> "RenderedTable":
        """Display rows: each reproduced row, then its paper row and difference where the paper
        has one; after a rule, the paper's rows that no reproduced row matches."""
        stats = self.stats()
        mean = stats["mean"].unstack(["group", "metric"]).reindex(index=self.rows, columns=self.columns)
        std = stats["std"].unstack(["group", "metric"]).reindex(index=self.rows, columns=self.columns)
        count = stats["n"].unstack(["group", "metric"]).reindex(index=self.rows, columns=self.columns)
        marks = pd.DataFrame("", index=self.rows, columns=self.columns, dtype=object)
        for column in self.columns:
            marks[column] = rank_marks(mean[column], not self.lower_is_better(column), self.decimals)
        paper_rows = self._paper_rows(paper)
        out: list[tuple[str, str, list[str], list[str]]] = []
        blank = [""] * len(self.columns)
        matched = set()
        for row in self.rows:
            out.append(
                (
                    row_label(row),
                    "reproduced",
                    [
                        mean_std_cell(mean.at[row, c], std.at[row, c], self.decimals, count.at[row, c])
                        for c in self.columns
                    ],
                    list(marks.loc[row]),
                )
            )
            name = match_paper_row(row, list(paper_rows))
            if name is None:
                continue
            matched.add(name)
            values, stds = paper_rows[name]
            out.append((f"{name} [paper]", "paper", self._paper_cells(values, stds), blank))
            out.append(
                (
                    f"{row_label(row)} Δ",
                    "delta",
                    [
                        signed_cell(mean.at[row, c] - values.get(c, math.nan), self.decimals)
                        for c in self.columns
                    ],
                    blank,
                )
            )
        rule = [len(out)] if any(name not in matched for name in paper_rows) else []
        for name, (values, stds) in paper_rows.items():
            if name not in matched:
                out.append((f"{name} [paper]", "paper", self._paper_cells(values, stds), blank))
        return RenderedTable(self, out, rule)

    def _paper_rows(self, paper: pd.DataFrame | None) -> dict[str, tuple[dict, dict]]:
        """Paper rows of this table that have a number in one of its columns, in file order."""
        if paper is None:
            return {}
        rows: dict[str, tuple[dict, dict]] = {}
        usable = set(self.columns) - set(self.no_paper_columns)
        for rec in paper[paper["table"] == self.name].itertuples():
            column = (rec.group, rec.metric)
            if column in usable:
                values, stds = rows.setdefault(rec.row, ({}, {}))
                values[column], stds[column] = rec.value, rec.std
        return rows

    def _paper_cells(self, values: dict, stds: dict) -> list[str]:
        return [
            mean_std_cell(values.get(c, math.nan), stds.get(c, math.nan), self.decimals) for c in self.columns
        ]


@dataclass
class RenderedTable:
    """Display strings of a table; ``rows`` are (name, kind, cells, marks), kind in
    ``reproduced`` / ``paper`` / ``delta``."""

    table: ReportTable
    rows: list[tuple[str, str, list[str], list[str]]]
    midrule_before: list[int]

    def _frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        columns = pd.MultiIndex.from_tuples([self.table.header(c) for c in self.table.columns])
        index = [name for name, *_ in self.rows]
        cells = pd.DataFrame([c for _, _, c, _ in self.rows], index=index, columns=columns)
        marks = pd.DataFrame([m for *_, m in self.rows], index=index, columns=columns)
        return cells, marks

    def to_markdown(self) -> str:
        cells, marks = self._frames()
        seeds = self.table.samples.groupby(["row", "group", "metric"]).size()
        n_seeds = f"{seeds.min()}" if seeds.min() == seeds.max() else f"{seeds.min()}–{seeds.max()}"
        lines = [
            f"### {self.table.name}",
            "",
            self.table.title,
            "",
            f"Seeds per cell: {n_seeds}. **Bold** / *italic*: best / second best "
            f"reproduced entry per column ({self._direction()}).",
            "",
            "",
        ]
        return "\n".join(lines) + markdown_table(cells, marks, self.table.row_header)

    def to_csv(self) -> str:
        """Plain cells (no marks); the ``kind`` column says reproduced / paper / delta."""
        cells, _ = self._frames()
        flat = cells.copy()
        flat.columns = [" ".join(p for p in c if p) for c in cells.columns]
        flat.insert(0, "kind", [kind for _, kind, _, _ in self.rows])
        flat.index.name = self.table.row_header
        return flat.to_csv()

    def to_latex(self) -> str:
        cells, marks = self._frames()
        body = latex_table(cells, marks, self.table.row_header, self.midrule_before)
        caption = latex_escape(f"{self.table.title} Bold / italic: best / second best ({self._direction()}).")
        return (
            "\\begin{table}[t]\n\\centering\n\\small\n"
            f"\\caption{{{caption}}}\n\\label{{tab:repro_{self.table.name}}}\n"
            f"{body}\\end{{table}}\n"
        )

    def _direction(self) -> str:
        lower = [
            self.table.header(c)[1] or self.table.header(c)[0]
            for c in self.table.columns
            if self.table.lower_is_better(c)
        ]
        if not lower:
            return "higher is better"
        if len(lower) == len(self.table.columns):
            return "lower is better"
        return f"lower is better for {', '.join(dict.fromkeys(lower))}, higher otherwise"


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


# ============================================================================ the tables
def _table(name, title, records, rows, columns, missing: str, **options) -> ReportTable:
    """A ``ReportTable`` from (row, group, metric, seed, value) records; None values are dropped,
    and ``MissingInputs(missing)`` is raised when nothing is left."""
    samples = pd.DataFrame(records, columns=["row", "group", "metric", "seed", "value"]).dropna(
        subset=["value"]
    )
    if samples.empty:
        raise MissingInputs(missing)
    present = set(zip(samples["group"], samples["metric"]))
    return ReportTable(
        name,
        title,
        samples,
        [r for r in rows if r in set(samples["row"])],
        [c for c in columns if c in present],
        **options,
    )


def _runs_with(inputs: ReportInputs, n_tasks: int = 10) -> list[dict]:
    return [r for r in inputs.runs if r["n_tasks"] == n_tasks]


def _labels(runs: list[dict]) -> list[str]:
    return sorted({r["label"] for r in runs})


def table1_main(inputs: ReportInputs) -> ReportTable:
    """Avg / Last accuracy per dataset (10 tasks) and their mean over the table's datasets."""
    runs = _runs_with(inputs, 10)
    if not runs:
        raise MissingInputs("no 10-task runs")
    metrics = ("avg_acc", "last_acc")
    datasets = ordered_datasets(r["dataset"] for r in runs)
    records = [(r["label"], r["dataset"], m, r["seed"], r["summary"][m]) for r in runs for m in metrics]
    # Average columns: per label and seed, the mean over the datasets; only for seeds that ran on
    # every dataset of the table, so that every row averages the same datasets.
    per_seed: dict[tuple, dict] = {}
    for r in runs:
        per_seed.setdefault((r["label"], r["seed"]), {})[r["dataset"]] = r["summary"]
    for (label, seed), summaries in per_seed.items():
        if set(summaries) == set(datasets):
            records += [
                (label, "average", m, seed, float(np.mean([s[m] for s in summaries.values()])))
                for m in metrics
            ]
    columns = [(d, m) for d in [*datasets, "average"] for m in metrics]
    # The paper's Average is over its four datasets; compare only when we have exactly those.
    skip = set() if set(datasets) == set(PAPER_DATASETS) else {("average", m) for m in metrics}
    return _table(
        "table1_main",
        "Avg / Last accuracy (%), 10 tasks; Average = mean over the datasets shown.",
        records,
        _labels(runs),
        columns,
        "no 10-task runs",
        no_paper_columns=skip,
        metric_names={
            "avg_acc": "Avg",
            "last_acc": "Last",
            ("average", "avg_acc"): "Avg-Acc",
            ("average", "last_acc"): "Last-Acc",
        },
    )


def table2_seq(inputs: ReportInputs) -> ReportTable:
    """Last accuracy with 5 and 20 tasks."""
    runs = [r for r in inputs.runs if r["n_tasks"] in (5, 20)]
    if not runs:
        raise MissingInputs("no 5- or 20-task runs")
    records = [
        (r["label"], r["dataset"], f"last_acc_T{r['n_tasks']}", r["seed"], r["summary"]["last_acc"])
        for r in runs
    ]
    columns = [(d, f"last_acc_T{t}") for d in ordered_datasets(r["dataset"] for r in runs) for t in (5, 20)]
    return _table(
        "table2_seq",
        "Last accuracy (%) with 5 and 20 tasks.",
        records,
        _labels(runs),
        columns,
        "no 5- or 20-task runs",
    )


def table2_ood(inputs: ReportInputs) -> ReportTable:
    """Avg / Last AUROC of seen-vs-future detection (10 tasks)."""
    runs = _runs_with(inputs, 10)
    metrics = ("avg_auroc", "last_auroc")
    records = [(r["label"], r["dataset"], m, r["seed"], r["summary"].get(m)) for r in runs for m in metrics]
    columns = [(d, m) for d in ordered_datasets(r["dataset"] for r in runs) for m in metrics]
    return _table(
        "table2_ood",
        "OOD detection (seen vs future classes): Avg / Last AUROC (%), 10 tasks.",
        records,
        _labels(runs),
        columns,
        "no 10-task run with AUROC",
    )


def table3_zeroshot(inputs: ReportInputs) -> ReportTable:
    """Zero-shot accuracy on unseen datasets: the original CLIP and knowledge fusion (eq. 8)."""
    runs = [r for r in inputs.all_runs if r.get("zero_shot")]
    if not runs:
        raise MissingInputs("no run has zero_shot results (run the zeroshot suite)")
    records, rows = [], ["CLIP"]
    for r in sorted(runs, key=lambda r: (ordered_datasets([r["dataset"]]), r["label"], r["seed"])):
        if r["label"] == "gr4cil":
            row = ZERO_SHOT_ROWS.get(r["dataset"], f"GR4CIL ({dataset_name(r['dataset'])})")
        else:
            row = f"{r['label']} ({dataset_name(r['dataset'])})"
        rows.append(row)
        for target, accs in r["zero_shot"].items():
            records.append(("CLIP", target, "acc", r["seed"], accs.get("clip")))  # the same CLIP in every run
            records.append((row, target, "acc", r["seed"], accs.get("fusion")))
    targets = ordered_datasets({rec[1] for rec in records}, first=ZERO_SHOT_TARGETS)
    return _table(
        "table3_zeroshot",
        "Zero-shot accuracy (%) on unseen datasets: the original CLIP and "
        "GR4CIL's knowledge fusion after CIL on CIFAR-100 (i) or ImageNet-R (ii).",
        records,
        list(dict.fromkeys(rows)),
        [(t, "acc") for t in targets],
        "no zero-shot run has fusion or CLIP accuracies",
    )


def table3_subspace(inputs: ReportInputs) -> ReportTable:
    """Distances between the image subspace and the text (I-T), compensation (I-C) and joint
    (I-TC) classifier subspaces, default GR4CIL, 10 tasks."""
    runs = default_gr4cil_runs(inputs)
    names = ("I-T", "I-C", "I-TC")
    records = [
        (
            n,
            r["dataset"],
            "distance",
            r["seed"],
            ((r.get("diagnostics") or {}).get("subspace_distance") or {}).get(n),
        )
        for r in runs
        for n in names
    ]
    columns = [(d, "distance") for d in ordered_datasets(r["dataset"] for r in runs)]
    return _table(
        "table3_subspace",
        "Subspace distance between image space and classifier spaces "
        "(default GR4CIL, 10 tasks; lower = closer).",
        records,
        list(names),
        columns,
        "no default-configuration GR4CIL 10-task run with subspace distances",
        row_header="distance",
        decimals=3,
    )


ABLATION_ROWS = {  # paper Table 4 rows, by the switches that differ from the full model
    "Base": {
        "use_anchor_loss": False,
        "use_separation_loss": False,
        "compensation": "off",
        "use_prototype_score": False,
    },
    "+ L_anc and L_sep": {"compensation": "off", "use_prototype_score": False},
    "+ Compensation term": {"use_prototype_score": False},
    "+ Prototype term (Full model)": {},
}
COMPENSATION_ROWS = {  # paper Table 5: orthogonal constraint x prototype initialisation
    "Orth ×, Proto ×": {"compensation": "unconstrained", "compensation_init": "random"},
    "Orth ✓, Proto ×": {"compensation": "orthogonal", "compensation_init": "random"},
    "Orth ×, Proto ✓": {"compensation": "unconstrained", "compensation_init": "prototype"},
    "Orth ✓, Proto ✓": {},
}


def _run_values(run: dict) -> dict:
    """The per-run numbers the ablation tables read: summary, run diagnostics, and the routing
    accuracy of the last stage."""
    return {
        **run["summary"],
        **(run.get("diagnostics") or {}),
        "last_routing_acc": run["stages"][-1].get("routing_acc"),
    }


def _variant_rows(inputs: ReportInputs, variants: dict[str, dict]) -> list[tuple[str, dict]]:
    """(row, run) for every 10-task GR4CIL run whose setting is one of ``variants``."""
    return [
        (row, run)
        for run in _runs_with(inputs, 10)
        for row, overrides in variants.items()
        if matches(run, overrides)
    ]


def _swept_rows(inputs: ReportInputs, keys: set[str], name: Callable[[dict], str]) -> list[tuple[str, dict]]:
    """(row, run) for 10-task GR4CIL runs that differ from the defaults only in ``keys``, sorted
    by the values of those switches."""
    swept = []
    for run in _runs_with(inputs, 10):
        differing = differing_switches(run)
        if differing is not None and differing <= keys:
            setting = gr4cil_setting(run)
            swept.append((tuple(setting[k] for k in sorted(keys)), name(setting), run))
    return [(row, run) for _, row, run in sorted(swept, key=lambda item: item[0])]


def _variant_table(name, title, pairs, rows, metrics, **options) -> ReportTable:
    """A table of config-identified rows on the datasets where some run differs from the default
    configuration (default runs alone make no ablation)."""
    pairs = _first_per(pairs, lambda pair: (pair[0], pair[1]["dataset"], pair[1]["seed"]))
    datasets = ordered_datasets(run["dataset"] for _, run in pairs if differing_switches(run))
    if not datasets:
        raise MissingInputs(f"no 10-task GR4CIL runs with the non-default settings of {name}")
    records = [
        (row, run["dataset"], m, run["seed"], _run_values(run).get(m))
        for row, run in pairs
        if run["dataset"] in datasets
        for m in metrics
    ]
    rows = rows if rows is not None else list(dict.fromkeys(row for row, _ in pairs))
    return _table(
        name,
        title,
        records,
        rows,
        [(d, m) for d in datasets for m in metrics],
        f"the runs of {name} lack {', '.join(metrics)}",
        **options,
    )


def table4_ablation(inputs: ReportInputs) -> ReportTable:
    return _variant_table(
        "table4_ablation",
        "Ablation of GR4CIL's components (%), 10 tasks.",
        _variant_rows(inputs, ABLATION_ROWS),
        list(ABLATION_ROWS),
        ("avg_acc", "last_acc", "avg_auroc", "last_auroc"),
    )


def table5_compensation(inputs: ReportInputs) -> ReportTable:
    return _variant_table(
        "table5_compensation",
        "Compensation head: orthogonal constraint (Orth) and "
        "prototype initialisation (Proto), accuracy (%), 10 tasks.",
        _variant_rows(inputs, COMPENSATION_ROWS),
        list(COMPENSATION_ROWS),
        ("avg_acc", "last_acc"),
        row_header="setting",
    )


def _tau_row(setting: dict) -> str:
    return f"τ={setting['tau']:g}"


def table_tau(inputs: ReportInputs) -> ReportTable:
    return _variant_table(
        "table_tau",
        "Separation threshold τ: accuracy and last-stage routing accuracy (%), 10 tasks.",
        _swept_rows(inputs, {"tau"}, _tau_row),
        None,
        ("avg_acc", "last_acc", "last_routing_acc"),
        row_header="τ",
    )


def table_beta_gamma(inputs: ReportInputs) -> ReportTable:
    swept = _swept_rows(inputs, {"beta", "gamma"}, lambda s: f"(β,γ)=({s['beta']:g},{s['gamma']:g})")
    return _variant_table(
        "table_beta_gamma",
        "Compensation weight β and prototype weight γ: accuracy and "
        "last-stage routing accuracy (%), 10 tasks.",
        swept,
        None,
        ("avg_acc", "last_acc", "last_routing_acc"),
        row_header="(β,γ)",
    )


def table_adjacent_subspace(inputs: ReportInputs) -> ReportTable:
    """Adjacent-task distances of compensation and text subspaces: without the anchor and
    separation losses (w/o) and for each τ."""
    without = _variant_rows(inputs, {"w/o": {"use_anchor_loss": False, "use_separation_loss": False}})
    return _variant_table(
        "table_adjacent_subspace",
        "Average adjacent-task subspace distance (lower = more "
        "similar), 10 tasks; w/o = without L_anc and L_sep.",
        without + _swept_rows(inputs, {"tau"}, _tau_row),
        None,
        ("adjacent_compensation_distance", "adjacent_text_distance"),
        row_header="setting",
        decimals=4,
    )


def table_anchor(inputs: ReportInputs) -> ReportTable:
    """Mean cosine between final text features of historical classes and their cached anchors."""
    runs = [r for r in _runs_with(inputs, 10) if r.get("strategy") == "gr4cil"]
    records = [
        (
            r["label"],
            r["dataset"],
            "anchor_preservation",
            r["seed"],
            (r.get("diagnostics") or {}).get("anchor_preservation"),
        )
        for r in runs
    ]
    columns = [(d, "anchor_preservation") for d in ordered_datasets(r["dataset"] for r in runs)]
    return _table(
        "table_anchor",
        "Anchor preservation: mean cos(t_c^T, z_c) over historical classes, 10 tasks.",
        records,
        _labels(runs),
        columns,
        "no 10-task GR4CIL run with anchor preservation",
        decimals=4,
    )


TABLES: dict[str, Callable[[ReportInputs], ReportTable]] = {
    "table1_main": table1_main,
    "table2_seq": table2_seq,
    "table2_ood": table2_ood,
    "table3_zeroshot": table3_zeroshot,
    "table3_subspace": table3_subspace,
    "table4_ablation": table4_ablation,
    "table5_compensation": table5_compensation,
    "table_anchor": table_anchor,
    "table_adjacent_subspace": table_adjacent_subspace,
    "table_tau": table_tau,
    "table_beta_gamma": table_beta_gamma,
}
