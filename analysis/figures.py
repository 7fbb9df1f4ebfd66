"""The paper's figures (and two extra views) from result JSON, as PNG and PDF.

Each ``fig_*`` function takes the loaded results and an output folder, writes ``NAME.png`` and
``NAME.pdf`` and returns their paths, or raises ``MissingInputs``. What the figures share in look
(sizes, each method's style, legends, the saved files) is ``analysis.figure_style``'s; here is what
each draws, at its size in ``FIGSIZES`` or ``panel_figsize``. Legends lie outside the axes.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from analysis.figure_style import (
    HATCHES,
    HIGHLIGHTED_METHOD,
    LINESTYLES,
    MARKERS,
    LineStyle,
    figure_style,
    legend_names,
    method_styles,
    panel_grid,
    plot_series,
    save_figure,
    unhidden,
)
from analysis.formatting import population_std
from analysis.gr4cil_settings import default_gr4cil_runs
from analysis.paper_inputs import (
    PAPER_DATASETS,
    MissingInputs,
    ReportInputs,
    dataset_name,
    ordered_datasets,
    row_label,
    split_of,
)
from benchmarks.data.splits import tasks_label
from benchmarks.runner.reading import figure_caveat
from benchmarks.runner.result_record import RunResult
from benchmarks.runner.results import RunKey, safe_label

FIGSIZES = {
    "fig2_gap_training": (4.8, 3.4),
    "fig3_gap_final": (4.8, 3.4),
    "fig5_confidence_margin": (9.0, 4.0),
    "fig6_cost": (12.0, 4.2),
    "acc_matrix": (5.2, 4.4),
}
ROUTING_VARIANTS = {
    "routing_acc_text_only": "Text only",
    "routing_acc_text_prototype": "Text + prototype",
    "routing_acc_full": "Full (+ compensation)",
}


def _bars(ax, groups: list[str], series: dict[str, tuple[list, list]], ylabel: str) -> None:
    """Grouped bars: one bar per series in each group, hatched per series, std as error bars."""
    width = 0.8 / len(series)
    x = np.arange(len(groups))
    palette = sns.color_palette("Greys", len(series) + 1)[1:]
    for i, (name, (means, stds)) in enumerate(series.items()):
        ax.bar(
            x + (i - (len(series) - 1) / 2) * width,
            means,
            width,
            yerr=stds,
            capsize=3,
            label=name,
            color=palette[i],
            edgecolor="black",
            hatch=HATCHES[i % len(HATCHES)],
        )
    ax.set_xticks(x, groups, rotation=20, ha="right")
    ax.set_ylabel(ylabel)


def _gap_run(inputs: ReportInputs) -> RunResult:
    """The run of fig2/fig3: a GR4CIL run with modality-gap statistics, preferring the default
    configuration and ImageNet-100 (the paper's example), then the paper's other datasets, then
    the first by path."""
    candidates = [
        r
        for r in inputs.runs
        if r.strategy == "gr4cil" and ((r.diagnostics or {}).get("modality_gap") or [[]])[0]
    ]
    if not candidates:
        raise MissingInputs("no GR4CIL run with modality-gap diagnostics")
    defaults = {id(r) for r in default_gr4cil_runs(inputs, n_tasks=None)}
    order = ["imagenet100", *[d for d in PAPER_DATASETS if d != "imagenet100"]]

    def rank(r: RunResult):
        return (
            id(r) not in defaults,
            order.index(r.dataset) if r.dataset in order else len(order),
            str(inputs.paths[r.key]),
        )

    return min(candidates, key=rank)


def _run_title(run: RunResult) -> str:
    tasks = tasks_label(run.n_tasks, split_of(run))
    return f"{run.label}, {dataset_name(run.dataset)}, {tasks}, seed {run.seed}"


def fig2_gap_training(inputs: ReportInputs, out_dir: Path) -> list[Path]:
    """Mean image-text cosine per epoch while training task 1: all, positive and negative pairs."""
    run = _gap_run(inputs)
    epochs = pd.DataFrame((run.diagnostics or {})["modality_gap"][0])
    with figure_style():
        fig = Figure(figsize=FIGSIZES["fig2_gap_training"], layout="constrained")
        ax = fig.subplots()
        for i, (key, name) in enumerate(
            (("overall", "All pairs"), ("positive", "Positive pairs"), ("negative", "Negative pairs"))
        ):
            ax.plot(
                epochs["epoch"],
                epochs[key],
                marker=MARKERS[i],
                linestyle=LINESTYLES[i],
                label=name,
                color=sns.color_palette("dark")[i],
            )
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("Training epoch (task 1)")
        ax.set_ylabel("Mean image–text cosine similarity")
        ax.set_title(f"Modality gap during training\n{_run_title(run)}", fontsize="medium")
        fig.legend(loc="outside lower center", ncols=3, frameon=False)  # off the curves
    return save_figure(fig, out_dir, "fig2_gap_training", caveat=inputs.caveat)


def fig3_gap_final(inputs: ReportInputs, out_dir: Path) -> list[Path]:
    """Overall image-text cosine at the last training epoch of each task."""
    run = _gap_run(inputs)
    finals = [
        (task, epochs[-1]["overall"])
        for task, epochs in enumerate((run.diagnostics or {})["modality_gap"], start=1)
        if epochs
    ]
    with figure_style():
        fig = Figure(figsize=FIGSIZES["fig3_gap_final"], layout="constrained")
        ax = fig.subplots()
        tasks, values = zip(*finals)
        ax.plot(tasks, values, marker="o", linestyle="-", color="black")
        ax.axhline(np.mean(values), linestyle="--", color="grey", label="Mean over tasks")
        ax.set_xticks(tasks)
        ax.set_xlabel("Task")
        ax.set_ylabel("Mean image–text cosine similarity\n(last epoch, all pairs)")
        ax.set_title(f"Final modality gap per task\n{_run_title(run)}", fontsize="medium")
        fig.legend(loc="outside lower center", frameon=False)
    return save_figure(fig, out_dir, "fig3_gap_final", caveat=inputs.caveat)


def _stage_mean(run: RunResult, key: str) -> float | None:
    found = [s.diagnostics.get(key) for s in run.stages if s.diagnostics]
    values = [v for v in found if v is not None]
    return float(np.mean(values)) if values else None


def fig5_confidence_margin(inputs: ReportInputs, out_dir: Path) -> list[Path]:
    """Intra-task confidence and GT-task margin with and without compensation, per dataset;
    each run's values are averaged over stages (the margin over stages 2..T), then over seeds."""
    runs = default_gr4cil_runs(inputs)
    rows = []
    for run in runs:
        for metric in ("confidence", "margin"):
            for variant, name in (
                ("without_compensation", "w/o compensation"),
                ("with_compensation", "w/ compensation"),
            ):
                value = _stage_mean(run, f"{metric}_{variant}")
                if value is not None:
                    rows.append({"dataset": run.dataset, "metric": metric, "variant": name, "value": value})
    if not rows:
        raise MissingInputs("no default GR4CIL 10-task run with confidence/margin diagnostics")
    frame = pd.DataFrame(rows)
    datasets = ordered_datasets(frame["dataset"])
    with figure_style():
        fig = Figure(figsize=FIGSIZES["fig5_confidence_margin"], layout="constrained")
        axes = fig.subplots(1, 2)
        # the paper's words (Sec. 5, Fig. 5): (a) intra-task confidence, (b) inter-task margin
        labels = {
            "confidence": (
                "Intra-task confidence\n(softmax probability of the true class\namong its task's classes)"
            ),
            "margin": "Inter-task margin\n(true task's score minus the highest\nscore of another task)",
        }
        titles = {"confidence": "(a) Intra-task confidence", "margin": "(b) Inter-task margin"}
        for ax, metric in zip(axes, ("confidence", "margin")):
            stats = (
                frame[frame["metric"] == metric]
                .groupby(["variant", "dataset"])["value"]
                .agg(mean="mean", std=population_std)
            )
            series = {
                v: (
                    [stats["mean"].get((v, d), np.nan) for d in datasets],
                    [stats["std"].get((v, d), np.nan) for d in datasets],
                )
                for v in ("w/o compensation", "w/ compensation")
            }
            _bars(ax, [dataset_name(d) for d in datasets], series, labels[metric])
            ax.set_title(titles[metric], fontsize="medium")
            ax.set_xlabel("Dataset")
        fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=2, frameon=False)
        fig.suptitle(
            "Effect of orthogonal compensation (default GR4CIL, 10 tasks)\nper run: mean over stages "
            "(margin: stages 2–T); bars: mean over seeds, error bars: std",
            fontsize="medium",
        )
    return save_figure(fig, out_dir, "fig5_confidence_margin", caveat=inputs.caveat)


#: what each ``cost.peak_memory_kind`` measures, as the axis of Fig. 6 names it
MEMORY_KINDS = {
    "cuda_allocated": "CUDA allocator peak of the run",
    "cpu_run_peak_rss": "resident-set peak of the run",
    "cpu_process_peak_rss": "process resident-set peak (earlier runs in the process included)",
    "cpu_max_rss": "process resident-set peak (earlier runs in the process included)",  # schema 1's name
}


def cost_frame(inputs: ReportInputs) -> tuple[str, pd.DataFrame]:
    """Fig. 6's data: the 10-task dataset that most labels ran (the paper's datasets first on ties)
    and one row per run on it: docs/decisions.md D9 row label, trainable parameters (millions),
    peak memory (bytes) and its kind, and the minutes it trained and evaluated."""
    # every method, a zero-shot one (no trainable parameter) included
    runs = [
        r for r in inputs.runs if r.n_tasks == 10 and not split_of(r) and r.cost.trainable_params is not None
    ]
    if not runs:
        raise MissingInputs("no 10-task run with cost records")
    datasets = ordered_datasets(r.dataset for r in runs)
    dataset = max(
        datasets, key=lambda d: (len({r.label for r in runs if r.dataset == d}), -datasets.index(d))
    )
    frame = pd.DataFrame(
        [
            {
                "label": row_label(r.label),
                "params": np.nan if r.cost.trainable_params is None else r.cost.trainable_params / 1e6,
                "memory": r.cost.peak_memory_bytes or np.nan,
                "kind": r.cost.peak_memory_kind or "unknown",
                "train_minutes": r.cost.train_seconds / 60,
                "eval_minutes": r.cost.eval_seconds / 60,
            }
            for r in runs
            if r.dataset == dataset
        ]
    )
    return dataset, frame


def fig6_cost(inputs: ReportInputs, out_dir: Path) -> list[Path]:
    """Trainable parameters, peak memory and time (training, then evaluation, stacked) of every
    method (``cost_frame``); the times are each run's own machine's."""
    dataset, frame = cost_frame(inputs)
    labels = sorted(frame["label"].unique())
    unit, scale = ("GiB", 2**30) if frame["memory"].max() >= 2**30 else ("MiB", 2**20)
    frame["memory"] /= scale
    kinds = "; ".join(sorted({MEMORY_KINDS.get(kind, kind) for kind in frame["kind"].unique()}))
    with figure_style():
        fig = Figure(figsize=FIGSIZES["fig6_cost"], layout="constrained")
        axes = fig.subplots(1, 3)
        palette = sns.color_palette("Greys", len(labels) + 1)[1:]
        for ax, column, ylabel in (
            (axes[0], "params", "Trainable parameters (millions)"),
            (axes[1], "memory", f"Peak memory ({unit})\n" + textwrap.fill(kinds, 40)),
        ):
            stats = frame.groupby("label")[column].agg(mean="mean", std=population_std)
            for i, label in enumerate(labels):
                ax.bar(
                    i,
                    stats.loc[label, "mean"],
                    yerr=stats.loc[label, "std"],
                    capsize=3,
                    color=palette[i],
                    edgecolor="black",
                    hatch=HATCHES[i % len(HATCHES)],
                )
            ax.set_ylabel(ylabel)
        times = frame.groupby("label")[["train_minutes", "eval_minutes"]].mean()
        for i, label in enumerate(labels):
            train, evaluate = times.loc[label, "train_minutes"], times.loc[label, "eval_minutes"]
            axes[2].bar(i, train, color=palette[i], edgecolor="black", hatch=HATCHES[i % len(HATCHES)])
            axes[2].bar(i, evaluate, bottom=train, color="white", edgecolor="black")
        axes[2].set_ylabel("Time per run (minutes)\nshaded: training; white: evaluation")
        for ax in axes:
            ax.set_xticks(range(len(labels)), labels, rotation=35, ha="right")
            ax.set_xlabel("Method")
        fig.suptitle(
            f"Computational cost on {dataset_name(dataset)}, 10 tasks "
            "(mean over seeds; time on each run's machine)",
            fontsize="medium",
        )
    return save_figure(fig, out_dir, "fig6_cost", caveat=inputs.caveat)


def fig7_routing(inputs: ReportInputs, out_dir: Path) -> list[Path]:
    """Per-stage routing accuracy of the three score variants, one panel per dataset."""
    rows = [
        {
            "panel": run.dataset,
            "seed": run.seed,
            "stage": stage.task,
            "series": name,
            "value": stage.diagnostics[key],
        }
        for run in default_gr4cil_runs(inputs)
        for stage in run.stages
        for key, name in ROUTING_VARIANTS.items()
        if (stage.diagnostics or {}).get(key) is not None
    ]
    if not rows:
        raise MissingInputs("no default GR4CIL 10-task run with routing diagnostics")
    frame = pd.DataFrame(rows)
    datasets = ordered_datasets(frame["panel"])
    # seaborn's "dark" colours and its first dash patterns, as this figure has always had
    styles = {
        name: LineStyle(sns.color_palette("dark")[i], MARKERS[i], dashes)
        for i, (name, dashes) in enumerate(zip(ROUTING_VARIANTS.values(), [(), (4, 1.5), (1, 1)]))
    }
    with figure_style():
        fig, axes = _stagepanel_grid(frame, datasets, dataset_name, styles, "Routing accuracy (%)")
        for ax, dataset in zip(axes, datasets):  # every stage: there are at most 10 here
            ax.set_xticks(sorted(frame[frame["panel"] == dataset]["stage"].unique()))
        fig.suptitle(
            "Routing accuracy per stage\n(default GR4CIL, 10 tasks; mean over seeds, band = std)",
            fontsize="medium",
        )
    return save_figure(fig, out_dir, "fig7_routing", caveat=inputs.caveat)


def fig_accuracy_curves(inputs: ReportInputs, out_dir: Path) -> list[Path]:
    """Accuracy on all seen classes after each stage, every label, one panel per dataset and
    task count (mean over seeds, band = std). Each method has its own colour and marker
    (``method_styles``); GR4CIL is drawn on top in a heavier line."""
    rows = [
        {
            "panel": (run.dataset, run.n_tasks, split_of(run)),  # B50-Inc10 apart from 6 equal tasks
            "series": row_label(run.label),
            "stage": stage.task,
            "value": stage.acc,
        }
        for run in inputs.runs
        for stage in run.stages
    ]
    if not rows:
        raise MissingInputs("no run has stages")
    frame = pd.DataFrame(rows)
    order = ordered_datasets({p[0] for p in frame["panel"]})
    panels = sorted(set(frame["panel"]), key=lambda p: (order.index(p[0]), p[1]))
    with figure_style():
        fig, _ = _stagepanel_grid(
            frame,
            panels,
            lambda panel: f"{dataset_name(panel[0])}, {_tasks_title(panel[1], panel[2])}",
            method_styles(sorted(frame["series"].unique())),
            "Accuracy on seen classes (%)",
            highlight=row_label(HIGHLIGHTED_METHOD),
        )
        fig.suptitle("Accuracy after each stage (mean over seeds, band = std)", fontsize="medium")
    return save_figure(fig, out_dir, "fig_accuracy_curves", caveat=inputs.caveat)


def _stagepanel_grid(
    frame: pd.DataFrame, panels: list, title, styles: dict[str, LineStyle], ylabel: str, highlight=None
) -> tuple[Figure, list]:
    """One panel per value of ``frame["panel"]`` (in ``panels`` order, titled ``title(panel)``):
    per ``series`` (in ``styles`` order, ``highlight`` on top), the mean ``value`` per stage over
    seeds with a band of ± std; one legend below the panels."""
    fig, axes = panel_grid(len(panels))
    shown = legend_names(styles)
    for ax, panel in zip(axes, panels):
        in_panel = frame[frame["panel"] == panel]
        present = set(in_panel["series"])
        drawn: list[np.ndarray] = []
        # the highlighted series last, so it is drawn over the others
        for name in sorted((n for n in styles if n in present), key=lambda n: n == highlight):
            values = in_panel[in_panel["series"] == name].groupby("stage")["value"]
            mean, std = values.mean(), values.std()  # std with ddof=1, seaborn's errorbar="sd"
            plot_series(
                ax,
                mean.index,
                mean,
                mean - std,
                mean + std,
                shown[name],
                unhidden(styles[name], mean, drawn),
                highlighted=name == highlight,
            )
            drawn.append(mean.to_numpy())
        ax.set_title(title(panel))
        ax.set_xlabel("Stage (tasks learned)")
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    # one legend for all panels, under them, with every series in ``styles`` order
    handles: dict[str, Any] = {}
    for ax in axes:
        lines, names = ax.get_legend_handles_labels()
        handles.update(zip(names, lines))
    labels = [shown[name] for name in styles if shown[name] in handles]
    fig.legend(
        [handles[n] for n in labels],
        labels,
        loc="outside lower center",
        ncols=min(len(labels), 4),
        frameon=False,
    )
    return fig, axes


def _tasks_title(n_tasks: int, split: str) -> str:
    return f"{tasks_label(n_tasks, split)} ({n_tasks} tasks)" if split else f"{n_tasks} tasks"


def _file_stem(key: RunKey) -> str:
    split = f"{key.split}_" if key.split else ""
    return f"{key.dataset}_{safe_label(key.label)}_{split}T{key.n_tasks}_seed{key.seed}"


def fig_acc_matrix(inputs: ReportInputs, out_dir: Path) -> list[Path]:
    """Per run, in ``out_dir/acc_matrix/``: accuracy (%) on each learned task (columns) after each
    stage (rows), annotated when there are at most 10 tasks."""
    runs = [r for r in inputs.runs if any(s.acc_per_task for s in r.stages)]
    if not runs:
        raise MissingInputs("no run has acc_per_task")
    paths = []
    for run in runs:
        matrix = np.full((len(run.stages), run.n_tasks), np.nan)
        for i, stage in enumerate(run.stages):
            values = stage.acc_per_task or []
            matrix[i, : len(values)] = values
        with figure_style():
            paths += save_figure(
                _heat_map(matrix, _run_title(run)),
                out_dir / "acc_matrix",
                _file_stem(run.key),
                caveat=figure_caveat([run]),
            )
    return paths


def _heat_map(matrix: np.ndarray, title: str) -> Figure:
    # imshow rather than sns.heatmap, and fixed margins rather than a layout engine: this figure
    # is drawn once per run, and both cut its cost several-fold.
    fig = Figure(figsize=FIGSIZES["acc_matrix"])
    fig.subplots_adjust(left=0.12, right=0.98, bottom=0.12, top=0.9)
    ax = fig.subplots()
    image = ax.imshow(np.ma.masked_invalid(matrix), vmin=0, vmax=100, cmap="viridis", aspect="auto")
    fig.colorbar(image, ax=ax, label="Accuracy on the task's test images (%)")
    rows, columns = matrix.shape
    if columns <= 10:
        for (i, j), value in np.ndenumerate(matrix):
            if not np.isnan(value):  # dark text on the light (high) end of viridis, white elsewhere
                ax.text(
                    j,
                    i,
                    f"{value:.0f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="black" if value > 60 else "white",
                )
    ax.set_xticks(range(columns), [str(t) for t in range(1, columns + 1)])
    ax.set_yticks(range(rows), [str(t) for t in range(1, rows + 1)])
    ax.grid(False)
    ax.set_xlabel("Evaluated task")
    ax.set_ylabel("Stage (tasks learned)")
    ax.set_title(title, fontsize="medium")
    return fig


FIGURES = {
    "fig2_gap_training": fig2_gap_training,
    "fig3_gap_final": fig3_gap_final,
    "fig5_confidence_margin": fig5_confidence_margin,
    "fig6_cost": fig6_cost,
    "fig7_routing": fig7_routing,
    "fig_accuracy_curves": fig_accuracy_curves,
    "acc_matrix": fig_acc_matrix,
}
