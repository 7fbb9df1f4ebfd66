"""The figure of how much the class order moves each method, drawn by the report where some method
ran a dataset and task count in several orders (a suite that lists them): per method, Last accuracy
per order with the seeds as points, and the spread between orders against that between seeds
(``analysis.statistics.order_variance``), in the look of ``analysis.figure_style``."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from analysis.figure_style import MARKERS, MIN_WIDTH, figure_style, save_figure
from analysis.paper_inputs import MissingInputs, ReportInputs, dataset_name, ordered_datasets, row_label
from analysis.statistics import order_variance
from benchmarks.runner.reading import figure_caveat
from benchmarks.runner.result_record import RunResult

ORDER_FIGURE = "fig_class_orders"


def order_name(run: RunResult) -> str:
    """A run's class order, by the name its config gives it."""
    return str(run.config.get("class_order") or run.key.order or "default")


#: what the figure shows, one column of panels each: the metric's name and its axis
METRICS = {"avg_acc": ("Avg", "Avg accuracy (%)"), "last_acc": ("Last", "Last accuracy (%)")}


def order_frame(runs: list[RunResult]) -> pd.DataFrame:
    """One row per run and metric of ``METRICS``, for each (dataset, task count) that some method
    ran in several class orders: panel (dataset, n_tasks), method (its row label), order, whether
    it is the protocol's default, seed, metric and value. Empty where every method ran one order."""
    frame = pd.DataFrame(
        [
            {
                "panel": (run.dataset, run.n_tasks),
                "method": row_label(run.label),
                "order": order_name(run),
                "default": run.key.order == "",
                "seed": run.seed,
                "metric": metric,
                "value": run.summary.get(metric),
            }
            for run in runs
            for metric in METRICS
        ],
        columns=["panel", "method", "order", "default", "seed", "metric", "value"],
    ).dropna(subset=["value"])
    several = frame.groupby(["panel", "method"])["order"].transform("nunique") > 1
    panels = set(frame.loc[several, "panel"])
    return frame[frame["panel"].isin(panels)].reset_index(drop=True)


def spread(values: pd.DataFrame) -> str:
    """``orders sd 4.1, seeds sd 1.2``: the standard deviations between the orders' means and
    between seeds within an order (``order_variance``), for a method's tick label."""
    groups = [group["value"].tolist() for _, group in values.groupby("order", sort=False)]
    if len(groups) < 2:
        return "one order"
    split = order_variance(groups)
    seeds = "–" if math.isnan(split.seed_variance) else f"{math.sqrt(split.seed_variance):.1f}"
    return f"orders sd {math.sqrt(split.order_variance):.1f}\nseeds sd {seeds}"


def _strip(ax, values: pd.DataFrame, methods: list[str], orders: list[str], palette) -> None:
    """Each method's values per order, side by side: the seeds as points, the order's mean a bar."""
    step = 0.7 / len(orders)
    for i, name in enumerate(orders):
        offset = (i - (len(orders) - 1) / 2) * step
        for x, method in enumerate(methods):
            seeds = values[(values["method"] == method) & (values["order"] == name)]["value"]
            if seeds.empty:
                continue
            ax.scatter(
                np.full(len(seeds), x + offset),
                seeds,
                marker=MARKERS[i % len(MARKERS)],
                color=palette[i],
                edgecolors="black",
                linewidths=0.5,
                s=30,
                zorder=3,
                label=f"order {name}",
            )
            ax.hlines(seeds.mean(), x + offset - step / 2, x + offset + step / 2, color=palette[i], lw=2)
    ticks = [f"{method}\n{spread(values[values['method'] == method])}" for method in methods]
    ax.set_xticks(range(len(methods)), ticks, fontsize="small")
    ax.set_xlim(-0.6, len(methods) - 0.4)
    ax.grid(False, axis="x")  # no line through the points


def fig_class_orders(inputs: ReportInputs, out_dir: Path) -> list[Path]:
    """How much the class order moves each method: per dataset and task count that some method ran
    in several orders (a row of panels), each method's Avg and Last accuracy (a panel each) per
    order, the seeds as points and the order's mean as a bar; under its name, the sd between the
    orders and between seeds within one."""
    frame = order_frame(inputs.every_order)
    if frame.empty:
        raise MissingInputs("no method ran a dataset and task count in more than one class order")
    datasets = ordered_datasets({panel[0] for panel in frame["panel"]})
    panels = sorted(set(frame["panel"]), key=lambda p: (datasets.index(p[0]), p[1]))
    # the protocol's default order first, then the others by name: a marker and colour each
    orders = list(dict.fromkeys(frame.sort_values(["default", "order"], ascending=[False, True])["order"]))
    palette = sns.color_palette("colorblind", len(orders))
    most = max(frame[frame["panel"] == p]["method"].nunique() for p in panels)
    with figure_style():
        fig = Figure(
            figsize=(max(MIN_WIDTH, 2 * (1.0 * most + 1.0)), 3.6 * len(panels) + 1.1), layout="constrained"
        )
        axes = fig.subplots(len(panels), len(METRICS), squeeze=False)
        for row, panel in zip(axes, panels):
            in_panel = frame[frame["panel"] == panel]
            methods = sorted(in_panel["method"].unique())
            for ax, (metric, (name, ylabel)) in zip(row, METRICS.items()):
                _strip(ax, in_panel[in_panel["metric"] == metric], methods, orders, palette)
                ax.set_ylabel(ylabel)
                ax.set_title(f"{name}: {dataset_name(panel[0])}, {panel[1]} tasks")
        handles = {}
        for ax in axes.ravel():
            handles.update({label: handle for handle, label in zip(*ax.get_legend_handles_labels())})
        labels = [f"order {name}" for name in orders if f"order {name}" in handles]
        fig.legend(
            [handles[n] for n in labels],
            labels,
            loc="outside lower center",
            ncols=min(len(labels), 4),
            frameon=False,
        )
        fig.suptitle(
            "How much the class order moves each method\n(points: seeds, bars: order means; "
            "sd between orders and between seeds within one)",
            fontsize="medium",
        )
    return save_figure(fig, out_dir, ORDER_FIGURE, caveat=figure_caveat(inputs.every_order))
