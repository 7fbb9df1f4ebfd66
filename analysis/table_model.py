"""The table model of the report: a table's per-seed values and how they are shown.

A ``ReportTable`` holds the per-seed values of every cell in long form (``row, group, metric,
seed, value``); cells are mean ± std over seeds (population std, as in ``analysis.tables``).
``ReportTable.render`` lays it out as a ``RenderedTable``: each reproduced row, then, where the
paper has the row, a "[paper]" row and a "Δ" row (reproduced mean minus paper) right below it;
it writes Markdown, CSV and LaTeX. Bold / italic mark the best / second-best reproduced entry of
each column (paper rows are reference only and never marked); higher is better except for the
metrics in ``LOWER_IS_BETTER`` (subspace distances, forgetting).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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
from analysis.paper_inputs import dataset_name, match_paper_row, row_label

METRIC_NAMES = {
    "avg_acc": "Avg-Acc",
    "last_acc": "Last-Acc",
    "avg_auroc": "Avg-AUROC",
    "last_auroc": "Last-AUROC",
    "last_routing_acc": "Last-Routing Acc",
    "forgetting": "Forgetting",
    "bwt": "BWT",
    "last_acc_T5": "5-task",
    "last_acc_T20": "20-task",
    "adjacent_compensation_distance": "Compensation-space distance",
    "adjacent_text_distance": "Text-space distance",
    "distance": "",
    "acc": "",
    "anchor_preservation": "",
}
# Distances: a smaller value means closer subspaces, so the smallest is best; and the least forgetting.
LOWER_IS_BETTER = frozenset(
    {"distance", "adjacent_compensation_distance", "adjacent_text_distance", "forgetting"}
)


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
