"""Shared table formatting: mean ± std cells, best/second-best marks, Markdown and booktabs LaTeX.

A table to render is a DataFrame of display strings (rows = row names, columns = a flat Index or a
two-level MultiIndex ``(group, metric)``) plus, optionally, a DataFrame of the same shape holding
``BEST``, ``SECOND`` or ``""`` per cell. Markdown marks best with ``**bold**`` and second best
with ``*italic*``; LaTeX with ``\\textbf`` and ``\\textit``, as the paper does.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np
import pandas as pd

BEST, SECOND = "best", "second"
MISSING = "–"  # a cell with no run behind it

# Symbols that appear in row names and cells, written as LaTeX math.
_LATEX_SYMBOLS = {
    "±": r"$\pm$",
    "Δ": r"$\Delta$",
    "τ": r"$\tau$",
    "β": r"$\beta$",
    "γ": r"$\gamma$",
    "×": r"$\times$",
    "✓": r"$\checkmark$",
    "–": "--",
    "−": "$-$",
}
_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def population_std(values) -> float:
    """Std over seeds with ddof=0 (0 for a single seed, which ``mean_std_cell`` shows as n = 1)."""
    return float(np.std(np.asarray(values, dtype=float)))


def mean_std_cell(mean: float, std: float | None, decimals: int = 2, n: int | None = None) -> str:
    """``"mean ± std"``; ``"mean (n = 1)"`` for one seed (a std of one value says nothing);
    ``"mean"`` when there is no std; ``MISSING`` when there is no mean."""
    if mean is None or math.isnan(mean):
        return MISSING
    if n == 1:
        return f"{mean:.{decimals}f} (n = 1)"
    if std is None or math.isnan(std):
        return f"{mean:.{decimals}f}"
    return f"{mean:.{decimals}f} ± {std:.{decimals}f}"


def signed_cell(value: float, decimals: int = 2) -> str:
    """A difference with an explicit sign, e.g. ``+0.12``; ``MISSING`` for NaN."""
    return MISSING if value is None or math.isnan(value) else f"{value:+.{decimals}f}"


def rank_marks(values: pd.Series, higher_is_better: bool, decimals: int = 2) -> pd.Series:
    """``BEST`` / ``SECOND`` / ``""`` per entry of one column.

    Values are compared as displayed (rounded to ``decimals``), so entries that print the same
    share a mark; NaN entries get none.
    """
    rounded = values.astype(float).round(decimals)
    distinct = sorted(rounded.dropna().unique(), reverse=higher_is_better)
    marks = pd.Series("", index=values.index, dtype=object)
    if distinct:
        marks[rounded == distinct[0]] = BEST
    if len(distinct) > 1:
        marks[rounded == distinct[1]] = SECOND
    return marks


def _header_text(column) -> str:
    parts = column if isinstance(column, tuple) else (column,)
    return " ".join(str(p) for p in parts if str(p))


def markdown_table(cells: pd.DataFrame, marks: pd.DataFrame | None = None, index_name: str = "method") -> str:
    """A GitHub Markdown table; marked cells become ``**bold**`` / ``*italic*``."""
    wrap = {BEST: "**{}**", SECOND: "*{}*", "": "{}"}
    header = [index_name] + [_header_text(c) for c in cells.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for i, (name, row) in enumerate(cells.iterrows()):
        texts = [str(v) for v in row]
        if marks is not None:
            texts = [wrap[m].format(t) if t != MISSING else t for t, m in zip(texts, marks.iloc[i])]
        lines.append("| " + " | ".join([str(name), *texts]) + " |")
    return "\n".join(lines) + "\n"


def latex_escape(text: str) -> str:
    """Escape LaTeX specials and write the symbols used in table text (±, Δ, τ, ✓, ...) as math."""
    out = []
    for char in str(text):
        out.append(_LATEX_SPECIAL.get(char) or _LATEX_SYMBOLS.get(char) or char)
    return "".join(out)


def _latex_header(columns: pd.Index, index_name: str) -> list[str]:
    """One header row for flat columns; for ``(group, metric)`` columns a grouped row with
    ``\\multicolumn`` and ``\\cmidrule`` above a row of metric names."""
    if not isinstance(columns, pd.MultiIndex):
        return [" & ".join([latex_escape(index_name), *(latex_escape(c) for c in columns)]) + r" \\"]
    groups: list[tuple[str, int]] = []  # (group, span) in column order
    for group, _ in columns:
        if groups and groups[-1][0] == group:
            groups[-1] = (group, groups[-1][1] + 1)
        else:
            groups.append((group, 1))
    metrics = [m for _, m in columns]
    if not any(metrics):  # one column per group: a single header row
        return [" & ".join([latex_escape(index_name), *(latex_escape(g) for g, _ in groups)]) + r" \\"]
    top, rules, start = [latex_escape(index_name)], [], 2
    for group, span in groups:
        top.append(
            rf"\multicolumn{{{span}}}{{c}}{{{latex_escape(group)}}}" if span > 1 else latex_escape(group)
        )
        if span > 1:
            rules.append(rf"\cmidrule(lr){{{start}-{start + span - 1}}}")
        start += span
    lines = [" & ".join(top) + r" \\"]
    if rules:
        lines.append(" ".join(rules))
    lines.append(" & ".join(["", *(latex_escape(m) for m in metrics)]) + r" \\")
    return lines


def latex_table(
    cells: pd.DataFrame,
    marks: pd.DataFrame | None = None,
    index_name: str = "method",
    midrule_before: Iterable[int] = (),
) -> str:
    """A booktabs ``tabular`` (column spec ``l`` + one ``c`` per column); marked cells are
    ``\\textbf`` / ``\\textit``; ``midrule_before`` lists body row positions preceded by a rule."""
    wrap = {BEST: r"\textbf{{{}}}", SECOND: r"\textit{{{}}}", "": "{}"}
    breaks = set(midrule_before)
    lines = [
        rf"\begin{{tabular}}{{l{'c' * cells.shape[1]}}}",
        r"\toprule",
        *_latex_header(cells.columns, index_name),
        r"\midrule",
    ]
    for i, (name, row) in enumerate(cells.iterrows()):
        if i in breaks and i > 0:
            lines.append(r"\midrule")
        texts = [latex_escape(v) for v in row]
        if marks is not None:
            texts = [wrap[m].format(t) if v != MISSING else t for t, v, m in zip(texts, row, marks.iloc[i])]
        lines.append(" & ".join([latex_escape(name), *texts]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"
