"""The comparison's tables (Markdown, CSV, LaTeX) and figures (``analysis.compare``)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.formatting import (
    MISSING,
    latex_escape,
    latex_table,
    markdown_table,
    mean_std_cell,
    population_std,
    signed_cell,
)
from analysis.pairing import LOWER_IS_BETTER, METHOD, METRICS, TASK_METRICS, Comparison
from analysis.statistics import CONFIDENCE
from benchmarks.core.atomic_io import atomic_write_text
from benchmarks.runner.results import safe_label


def _mean_cell(values: dict[int, float]) -> str:
    """``mean ± std (n = k)``, or ``mean (n = 1)``."""
    numbers = list(values.values())
    if not numbers:
        return MISSING
    cell = mean_std_cell(float(np.mean(numbers)), population_std(numbers), n=len(numbers))
    return cell if len(numbers) == 1 else f"{cell} (n = {len(numbers)})"


def comparison_frame(comparisons: list[Comparison]) -> pd.DataFrame:
    """One row per comparison, display strings (for Markdown and LaTeX)."""
    rows = []
    for c in comparisons:
        d = c.difference
        rows.append(
            {
                "method": c.label,
                "dataset": c.dataset,
                "tasks": str(c.n_tasks),
                "mean ± std": _mean_cell(c.values),
                f"{c.baseline} mean ± std": _mean_cell(c.baseline_values),
                "paired seeds": ", ".join(map(str, c.paired_seeds)) or "none (unpaired)",
                "difference": signed_cell(c.estimate) if c.estimate is not None else MISSING,
                "95 % interval": f"[{d.low:+.2f}, {d.high:+.2f}]" if d else MISSING,
                "verdict": c.verdict,
                "detectable (80 % power)": f"{d.detectable:.2f}" if d else MISSING,
            }
        )
    return pd.DataFrame(rows).set_index("method")


def numbers_frame(comparisons: list[Comparison]) -> pd.DataFrame:
    """One row per comparison, numbers (for CSV)."""
    rows = []
    for c in comparisons:
        d = c.difference
        mine, theirs = list(c.values.values()), list(c.baseline_values.values())
        rows.append(
            {
                "method": c.label,
                "baseline": c.baseline,
                "dataset": c.dataset,
                "n_tasks": c.n_tasks,
                "metric": c.metric,
                "n": len(mine),
                "mean": np.mean(mine),
                "std": population_std(mine),
                "baseline_n": len(theirs),
                "baseline_mean": np.mean(theirs),
                "baseline_std": population_std(theirs),
                "paired_seeds": " ".join(map(str, c.paired_seeds)),
                "difference": c.estimate if c.estimate is not None else math.nan,
                "low": d.low if d else math.nan,
                "high": d.high if d else math.nan,
                "standard_error": d.standard_error if d else math.nan,
                "detectable": d.detectable if d else math.nan,
                "verdict": c.verdict,
                "notes": "; ".join(c.notes),
            }
        )
    return pd.DataFrame(rows)


def metric_title(metric: str) -> str:
    """The metric with its unit, as a table's title names it."""
    return f"{METRICS[metric][1]} ({'points of accuracy' if metric in TASK_METRICS else '%'})"


def direction(metric: str) -> str:
    """Which sign of the difference the verdict calls better."""
    if metric in LOWER_IS_BETTER:
        return "Lower is better: a negative difference (the method forgets less) is 'better'."
    return "Higher is better: a positive difference is 'better'."


def render_markdown(comparisons: list[Comparison], problems: list[str] = ()) -> str:
    metric = comparisons[0].metric
    baseline = comparisons[0].baseline
    lines = [
        f"# {metric_title(metric)} against {baseline}",
        "",
        markdown_table(comparison_frame(comparisons), index_name="method"),
        f"Difference: method minus {baseline}, mean over the paired seeds. {direction(metric)} "
        f"Interval: {METHOD}.",
        "",
    ]
    notes = [f"{c.label} on {c.dataset} / {c.n_tasks} tasks: {note}" for c in comparisons for note in c.notes]
    if notes or problems:
        lines += ["Notes:", "", *(f"- {line}" for line in [*notes, *problems]), ""]
    return "\n".join(lines)


def render_latex(comparisons: list[Comparison], name: str) -> str:
    """A booktabs table with a caption that names the baseline, the metric and the method."""
    c = comparisons[0]
    caption = latex_escape(
        f"{metric_title(c.metric)} against {c.baseline}: difference = method minus "
        f"{c.baseline}, mean over the paired seeds. {direction(c.metric)} Interval: {METHOD}."
    )
    body = latex_table(comparison_frame(comparisons), index_name="method")
    return (
        f"\\begin{{table}}[t]\n\\centering\n\\small\n\\caption{{{caption}}}\n\\label{{tab:{name}}}\n"
        f"{body}\\end{{table}}\n"
    )


def draw_figure(comparisons: list[Comparison], label: str, out_dir: Path) -> list[Path]:
    """Accuracy per stage with 95 % bands for ``label`` and the baseline (one panel per dataset
    and task count), and a forest plot of the paired differences."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    from analysis.figure_style import (
        HIGHLIGHT_ZORDER,
        comparison_styles,
        figure_style,
        legend_names,
        plot_series,
        save_figure,
        unhidden,
    )

    mine = [c for c in comparisons if c.label == label]
    baseline, metric = mine[0].baseline, mine[0].metric
    styles = comparison_styles(label, baseline)  # both solid, each in its own colour
    shown = legend_names([label, baseline])
    with figure_style():
        fig = Figure(figsize=(3.4 * (len(mine) + 1), 3.4), layout="constrained")
        axes = fig.subplots(1, len(mine) + 1, squeeze=False)[0]
        for ax, c in zip(axes, mine):
            drawn = []
            # the baseline first, in a heavier line; the strategy over it, so that where both are
            # equal the baseline's wider line still shows around it
            for name, highlighted in ((baseline, True), (c.label, False)):
                mean, low, high = c.stage_bands[name]
                stages = np.arange(1, len(mean) + 1)
                style = unhidden(styles[name], mean, drawn)
                plot_series(
                    ax,
                    stages,
                    mean,
                    low,
                    high,
                    shown[name],
                    style,
                    highlighted,
                    markersize=6 if highlighted else 4,
                    zorder=HIGHLIGHT_ZORDER - 0.5 if highlighted else HIGHLIGHT_ZORDER,
                )
                drawn.append(mean)
            ax.set_title(f"{c.dataset}, {c.n_tasks} tasks")
            ax.set_xlabel("Stage (tasks learned)")
            ax.set_ylabel("Accuracy (%)")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        # one legend, outside the panels: it never hides a curve, and the layout leaves it room
        handles, names = axes[0].get_legend_handles_labels()
        order = [names.index(shown[label]), names.index(shown[baseline])]
        fig.legend(
            [handles[i] for i in order],
            [names[i] for i in order],
            loc="outside lower center",
            ncols=2,
            frameon=False,
        )
        forest = axes[-1]
        for row, c in enumerate(mine):
            if c.difference is not None:
                d = c.difference
                forest.errorbar(
                    d.estimate,
                    row,
                    xerr=[[d.estimate - d.low], [d.high - d.estimate]],
                    fmt="o",
                    color="black",
                    capsize=3,
                )
        forest.axvline(0.0, color="grey", linewidth=1)
        forest.set_yticks(range(len(mine)), [f"{c.dataset}, T={c.n_tasks}" for c in mine])
        forest.set_ylim(-0.7, len(mine) - 0.3)
        # two lines fit the panel
        forest.set_xlabel(f"{METRICS[metric][1]} (pts):\n{shown[label]} − {shown[baseline]}")
        forest.set_title(f"Paired difference, {CONFIDENCE:.0%} interval".replace("%", " %"))
    return save_figure(fig, out_dir, f"compare-{safe_label(label)}-{metric}")  # named as the run's folder is


def write_comparison(
    comparisons: list[Comparison],
    out_dir: str | Path,
    problems: list[str] = (),
    table_dir: str | Path | None = None,
    stem: str = "compare",
) -> list[Path]:
    """``<stem>-<metric>.md``, ``.csv`` and ``.tex`` under ``table_dir`` (default ``out_dir``), and
    one figure per strategy under ``out_dir``."""
    out_dir = Path(out_dir)
    metric = comparisons[0].metric
    paths = [Path(table_dir or out_dir) / f"{stem}-{metric}.{ext}" for ext in ("md", "csv", "tex")]
    atomic_write_text(paths[0], render_markdown(comparisons, problems))
    atomic_write_text(paths[1], numbers_frame(comparisons).to_csv(index=False))
    atomic_write_text(paths[2], render_latex(comparisons, f"{stem}-{metric}"))
    for label in dict.fromkeys(c.label for c in comparisons):
        paths += draw_figure(comparisons, label, out_dir)
    return paths
