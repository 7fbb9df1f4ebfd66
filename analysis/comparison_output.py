"""The comparison's tables (Markdown, CSV, LaTeX) and figures (``analysis.compare``).

Where runs span several class orders, n is said as orders x seeds, the paired units are listed by
order, and the Markdown adds a section "By class order" (each order's difference with its interval,
and how the differences' variance splits between orders and seeds), also written as
``<stem>-<metric>-orders.csv``. Comparisons of one order read as they always have.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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
from analysis.orders import Unit, units_phrase
from analysis.pairing import LOWER_IS_BETTER, METHOD, METRICS, TASK_METRICS, Comparison
from analysis.statistics import CONFIDENCE
from benchmarks.core.atomic_io import atomic_write_text
from benchmarks.runner.reading import CANNOT_RANK, ranking_caveat
from benchmarks.runner.results import safe_label


def _mean_cell(values: dict[Unit, float], several_orders: bool = False) -> str:
    """``mean ± std (n = k)``, or ``mean (n = 1)``; over several orders, ``(n = 2 orders × 3
    seeds)``."""
    numbers = list(values.values())
    if not numbers:
        return MISSING
    cell = mean_std_cell(float(np.mean(numbers)), population_std(numbers), n=len(numbers))
    if several_orders:
        return f"{cell.removesuffix(' (n = 1)')} (n = {units_phrase(values)})"
    return cell if len(numbers) == 1 else f"{cell} (n = {len(numbers)})"


def _several_orders(comparisons: list[Comparison]) -> bool:
    return any(c.several_orders for c in comparisons)


def paired_by_order(c: Comparison, separator: str = "; ") -> str:
    """``seed1993: 0, 1; seed0: 0, 1``: the paired seeds of each class order."""
    orders = dict.fromkeys(u.order for u in c.paired_units)
    return separator.join(
        f"{c.order_names.get(o, o)}: {', '.join(str(u.seed) for u in c.paired_units if u.order == o)}"
        for o in orders
    )


def comparison_frame(comparisons: list[Comparison]) -> pd.DataFrame:
    """One row per comparison, display strings (for Markdown and LaTeX)."""
    rows, several = [], _several_orders(comparisons)
    for c in comparisons:
        d = c.difference
        paired = (
            {"paired units (order: seeds)": paired_by_order(c) or "none (unpaired)"}
            if several
            else {"paired seeds": ", ".join(str(u.seed) for u in c.paired_units) or "none (unpaired)"}
        )
        rows.append(
            {
                "method": c.label,
                "dataset": c.dataset,
                "tasks": str(c.n_tasks),
                "mean ± std": _mean_cell(c.values, several),
                f"{c.baseline} mean ± std": _mean_cell(c.baseline_values, several),
                **paired,
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
                "paired_seeds": " ".join(
                    f"{c.order_name(u)}/{u.seed}" if c.several_orders else str(u.seed) for u in c.paired_units
                ),
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


def orders_frame(comparisons: list[Comparison]) -> pd.DataFrame:
    """One row per class order of each comparison over several (numbers, for CSV): its seeds, the
    means, the difference with its interval; and the comparison's variance split, on every row."""
    rows = []
    for c in comparisons:
        split = c.order_split
        if split is None:  # one class order: no row of its own
            continue
        for row in c.by_order:
            d = row.difference
            rows.append(
                {
                    "method": c.label,
                    "baseline": c.baseline,
                    "dataset": c.dataset,
                    "n_tasks": c.n_tasks,
                    "metric": c.metric,
                    "order": row.order,
                    "seeds": " ".join(map(str, row.seeds)),
                    "mean": row.mean,
                    "baseline_mean": row.baseline_mean,
                    "difference": row.estimate,
                    "low": d.low if d else math.nan,
                    "high": d.high if d else math.nan,
                    "order_sd": math.sqrt(split.order_variance),
                    "seed_sd": math.sqrt(split.seed_variance),
                    "order_share": split.order_share,
                    "f_statistic": split.f_statistic,
                    "p_value": split.p_value,
                }
            )
    return pd.DataFrame(rows)


def split_sentence(c: Comparison) -> str:
    """How the paired differences spread between class orders and seeds, in words."""
    s = c.order_split
    if s is None:
        return "one class order: nothing to split"
    if math.isnan(s.seed_variance):
        return (
            f"{s.n_orders} orders, one paired seed each: how much is the order's and how much the "
            "seed's cannot be told apart; run several seeds in each order"
        )
    return (
        f"between orders sd {math.sqrt(s.order_variance):.2f}, between seeds within an order sd "
        f"{math.sqrt(s.seed_variance):.2f}: {s.order_share:.0%} of the variance lies between the "
        f"{s.n_orders} orders (one-way ANOVA over {s.n_units} units, F = {s.f_statistic:.2f}, "
        f"p = {s.p_value:.3g})"
    ).replace("%", " %")


def _orders_markdown(comparisons: list[Comparison]) -> list[str]:
    """The section "By class order": each order's paired difference, and the variance split."""
    rows = [
        {
            "method": c.label,
            "dataset": c.dataset,
            "tasks": str(c.n_tasks),
            "order": row.order,
            "paired seeds": ", ".join(map(str, row.seeds)),
            "mean": f"{row.mean:.2f}",
            f"{c.baseline} mean": f"{row.baseline_mean:.2f}",
            "difference": signed_cell(row.estimate),
            "95 % interval": f"[{row.difference.low:+.2f}, {row.difference.high:+.2f}]"
            if row.difference
            else MISSING,
        }
        for c in comparisons
        for row in c.by_order
    ]
    if not rows:
        return []
    splits = [
        f"- {c.label} on {c.dataset} / {c.n_tasks} tasks: {split_sentence(c)}."
        for c in comparisons
        if c.by_order
    ]
    return [
        "## By class order",
        "",
        markdown_table(pd.DataFrame(rows).set_index("method"), index_name="method"),
        "Each order's difference: mean over its paired seeds, interval over its seeds and test images. "
        "How the paired differences spread (variance components of a one-way analysis of variance, "
        "orders as groups):",
        "",
        *splits,
        "",
    ]


def metric_title(metric: str) -> str:
    """The metric with its unit, as a table's title names it."""
    return f"{METRICS[metric][1]} ({'points of accuracy' if metric in TASK_METRICS else '%'})"


def direction(metric: str) -> str:
    """Which sign of the difference the verdict calls better."""
    if metric in LOWER_IS_BETTER:
        return "Lower is better: a negative difference (the method forgets less) is 'better'."
    return "Higher is better: a positive difference is 'better'."


def render_markdown(comparisons: list[Comparison], problems: Sequence[str] = ()) -> str:
    metric = comparisons[0].metric
    baseline = comparisons[0].baseline
    offline = sorted({c.cannot_rank for c in comparisons if c.cannot_rank})
    caveat = [f"**Not a ranking**: runs on {' and '.join(offline)}: {CANNOT_RANK}.", ""] if offline else []
    lines = [
        f"# {metric_title(metric)} against {baseline}",
        "",
        *caveat,
        markdown_table(comparison_frame(comparisons), index_name="method"),
        f"Difference: method minus {baseline}, mean over the paired {_units(comparisons)}. "
        f"{direction(metric)} Interval: {_method(comparisons)}.",
        "",
        *_orders_markdown(comparisons),
    ]
    notes = [f"{c.label} on {c.dataset} / {c.n_tasks} tasks: {note}" for c in comparisons for note in c.notes]
    problems = [line for line in problems if not (caveat and line.endswith(CANNOT_RANK))]  # said above
    if notes or problems:
        lines += ["Notes:", "", *(f"- {line}" for line in [*notes, *problems]), ""]
    return "\n".join(lines)


def _units(comparisons: list[Comparison]) -> str:
    return "units (class order, seed)" if _several_orders(comparisons) else "seeds"


def _method(comparisons: list[Comparison]) -> str:
    """How the interval is made; over several orders, the units are (order, seed)."""
    if not _several_orders(comparisons):
        return METHOD
    return METHOD.replace("over seeds", "over units (class order, seed)")


def render_latex(comparisons: list[Comparison], name: str) -> str:
    """A booktabs table with a caption that names the baseline, the metric and the method."""
    c = comparisons[0]
    caption = latex_escape(
        f"{metric_title(c.metric)} against {c.baseline}: difference = method minus "
        f"{c.baseline}, mean over the paired {_units(comparisons)}. {direction(c.metric)} "
        f"Interval: {_method(comparisons)}."
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
            drawn: list[np.ndarray] = []
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
    caveat = ranking_caveat(c.cannot_rank for c in mine)
    # named as the run's folder is
    return save_figure(fig, out_dir, f"compare-{safe_label(label)}-{metric}", caveat)


def write_comparison(
    comparisons: list[Comparison],
    out_dir: str | Path,
    problems: Sequence[str] = (),
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
    if _several_orders(comparisons):
        paths.append(Path(table_dir or out_dir) / f"{stem}-{metric}-orders.csv")
        atomic_write_text(paths[-1], orders_frame(comparisons).to_csv(index=False))
    for label in dict.fromkeys(c.label for c in comparisons):
        paths += draw_figure(comparisons, label, out_dir)
    return paths
