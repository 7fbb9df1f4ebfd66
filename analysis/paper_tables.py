"""The paper's tables built from result JSON, with the paper's published numbers beside them.

Each ``table_*`` builder takes the loaded results (``ReportInputs``, ``analysis.paper_inputs``) and
returns a ``ReportTable`` (``analysis.table_model``), or raises ``MissingInputs`` with a one-line
reason. ``TABLES`` lists them in the paper's order.

Which runs feed which table:

* Rows named by run *label* (so a new strategy is one more row, with no code change):
  ``table1_main``, ``table2_seq``, ``table2_ood``, ``table_forgetting`` (not a paper table: average
  forgetting and backward transfer, which reviewers ask for), ``table_anchor``.
* Rows found from the resolved GR4CIL config, never from labels (``analysis.gr4cil_settings``):
  ``table4_ablation``, ``table5_compensation``, ``table_adjacent_subspace``, ``table_tau``,
  ``table_beta_gamma``; and the diagnostics of the default configuration: ``table3_subspace``.
  The rows of Tables 4 and 5 and the "w/o" row are the runs of ``benchmarks/suites/ablation.toml``
  and ``params.toml`` that print them (``ABLATION_RUNS``, ``COMPENSATION_RUNS``, ``WITHOUT_LOSSES_RUN``):
  their settings are read from the suites. The ablation tables show only datasets where some run
  differs from the defaults.
* ``table3_zeroshot`` reads the ``zero_shot`` key of zero-shot runs.

All tables except ``table2_seq`` use 10-task runs, as in the paper. Each builder reads the runs as
typed records (``RunResult``, ``benchmarks.runner.reading``).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from analysis.gr4cil_settings import (
    default_gr4cil_runs,
    differing_switches,
    first_per,
    gr4cil_setting,
    matches,
    suite_setting,
)
from analysis.paper_inputs import (
    PAPER_DATASETS,
    MissingInputs,
    ReportInputs,
    dataset_name,
    ordered_datasets,
    split_of,
)
from analysis.table_model import ReportTable
from benchmarks.runner.result_record import RunResult

ZERO_SHOT_TARGETS = ("pets", "food101", "imagenet1k")
ZERO_SHOT_ROWS = {"cifar100": "GR4CIL i", "imagenet_r": "GR4CIL ii"}  # the paper's names by training set


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


def _runs_with(inputs: ReportInputs, n_tasks: int = 10) -> list[RunResult]:
    """The runs of ``n_tasks`` equal tasks (a half-base split of as many tasks is another protocol)."""
    return [r for r in inputs.runs if r.n_tasks == n_tasks and not split_of(r)]


def _labels(runs: list[RunResult]) -> list[str]:
    return sorted({r.label for r in runs})


def table1_main(inputs: ReportInputs) -> ReportTable:
    """Avg / Last accuracy per dataset (10 tasks) and their mean over the table's datasets."""
    runs = _runs_with(inputs, 10)
    if not runs:
        raise MissingInputs("no 10-task runs")
    metrics = ("avg_acc", "last_acc")
    datasets = ordered_datasets(r.dataset for r in runs)
    records = [(r.label, r.dataset, m, r.seed, r.summary[m]) for r in runs for m in metrics]
    # Average columns: per label and seed, the mean over the datasets; only for seeds that ran on
    # every dataset of the table, so that every row averages the same datasets.
    per_seed: dict[tuple, dict] = {}
    for r in runs:
        per_seed.setdefault((r.label, r.seed), {})[r.dataset] = r.summary
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
    runs = [r for r in inputs.runs if r.n_tasks in (5, 20) and not split_of(r)]
    if not runs:
        raise MissingInputs("no 5- or 20-task runs")
    records = [(r.label, r.dataset, f"last_acc_T{r.n_tasks}", r.seed, r.summary["last_acc"]) for r in runs]
    columns = [(d, f"last_acc_T{t}") for d in ordered_datasets(r.dataset for r in runs) for t in (5, 20)]
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
    return _summary_table(
        inputs,
        "table2_ood",
        "OOD detection (seen vs future classes): Avg / Last AUROC (%), 10 tasks.",
        ("avg_auroc", "last_auroc"),
        "no 10-task run with AUROC",
    )


def table_forgetting(inputs: ReportInputs) -> ReportTable:
    """Average forgetting and backward transfer (10 tasks), from the per-task accuracies."""
    return _summary_table(
        inputs,
        "table_forgetting",
        "Average forgetting (lower is better) and backward transfer, BWT (negative when later tasks "
        "cost earlier ones), points of accuracy, 10 tasks. Not in the paper.",
        ("forgetting", "bwt"),
        "no 10-task run with per-task accuracies",
    )


def _summary_table(inputs: ReportInputs, name: str, caption: str, metrics: tuple[str, ...], empty: str):
    """The 10-task runs' summary ``metrics``, one column per (dataset, metric)."""
    runs = _runs_with(inputs, 10)
    records = [(r.label, r.dataset, m, r.seed, r.summary.get(m)) for r in runs for m in metrics]
    columns = [(d, m) for d in ordered_datasets(r.dataset for r in runs) for m in metrics]
    return _table(name, caption, records, _labels(runs), columns, empty)


def table3_zeroshot(inputs: ReportInputs) -> ReportTable:
    """Zero-shot accuracy on unseen datasets: the original CLIP and knowledge fusion (eq. 8)."""
    runs = [r for r in inputs.all_runs if r.zero_shot]
    if not runs:
        raise MissingInputs("no run has zero_shot results (run the zeroshot suite)")
    records, rows = [], ["CLIP"]
    for r in sorted(runs, key=lambda r: (ordered_datasets([r.dataset]), r.label, r.seed)):
        if r.label == "gr4cil":
            row = ZERO_SHOT_ROWS.get(r.dataset, f"GR4CIL ({dataset_name(r.dataset)})")
        else:
            row = f"{r.label} ({dataset_name(r.dataset)})"
        rows.append(row)
        for target, accs in (r.zero_shot or {}).items():
            records.append(("CLIP", target, "acc", r.seed, accs.get("clip")))  # the same CLIP in every run
            records.append((row, target, "acc", r.seed, accs.get("fusion")))
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
        (n, r.dataset, "distance", r.seed, ((r.diagnostics or {}).get("subspace_distance") or {}).get(n))
        for r in runs
        for n in names
    ]
    columns = [(d, "distance") for d in ordered_datasets(r.dataset for r in runs)]
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


# The runs of benchmarks/suites/ablation.toml that print each row of paper Table 4 (components) and
# Table 5 (orthogonal constraint x prototype initialisation); "gr4cil" itself is the full model.
ABLATION_RUNS = {
    "Base": "gr4cil-base",
    "+ L_anc and L_sep": "gr4cil-losses",
    "+ Compensation term": "gr4cil-losses-comp",
    "+ Prototype term (Full model)": "gr4cil",
}
COMPENSATION_RUNS = {
    "Orth ×, Proto ×": "gr4cil-free-random",
    "Orth ✓, Proto ×": "gr4cil-orth-random",
    "Orth ×, Proto ✓": "gr4cil-free-proto",
    "Orth ✓, Proto ✓": "gr4cil",
}
WITHOUT_LOSSES_RUN = ("params", "gr4cil-no-reg")  # the "w/o" row (no L_anc, no L_sep) of the adjacent table


def ablation_rows() -> dict[str, dict]:
    """Paper Table 4's rows, by the switches that differ from the full model."""
    return {row: suite_setting("ablation", label) for row, label in ABLATION_RUNS.items()}


def compensation_rows() -> dict[str, dict]:
    """Paper Table 5's rows, by the switches that differ from the full model."""
    return {row: suite_setting("ablation", label) for row, label in COMPENSATION_RUNS.items()}


def _run_values(run: RunResult) -> dict:
    """The per-run numbers the ablation tables read: summary, run diagnostics, and the routing
    accuracy of the last stage."""
    return {**run.summary, **(run.diagnostics or {}), "last_routing_acc": run.stages[-1].routing_acc}


def _variant_rows(inputs: ReportInputs, variants: dict[str, dict]) -> list[tuple[str, RunResult]]:
    """(row, run) for every 10-task GR4CIL run whose setting is one of ``variants``."""
    return [
        (row, run)
        for run in _runs_with(inputs, 10)
        for row, overrides in variants.items()
        if matches(run, overrides)
    ]


def _swept_rows(
    inputs: ReportInputs, keys: set[str], name: Callable[[dict], str]
) -> list[tuple[str, RunResult]]:
    """(row, run) for 10-task GR4CIL runs that differ from the defaults only in ``keys``, sorted
    by the values of those switches."""
    swept = []
    for run in _runs_with(inputs, 10):
        differing = differing_switches(run)
        setting = gr4cil_setting(run)
        if differing is not None and differing <= keys and setting is not None:
            swept.append((tuple(setting[k] for k in sorted(keys)), name(setting), run))
    return [(row, run) for _, row, run in sorted(swept, key=lambda item: item[0])]


def _variant_table(name, title, pairs, rows, metrics, **options) -> ReportTable:
    """A table of config-identified rows on the datasets where some run differs from the default
    configuration (default runs alone make no ablation)."""
    pairs = first_per(pairs, lambda pair: (pair[0], pair[1].dataset, pair[1].seed))
    datasets = ordered_datasets(run.dataset for _, run in pairs if differing_switches(run))
    if not datasets:
        raise MissingInputs(f"no 10-task GR4CIL runs with the non-default settings of {name}")
    records = [
        (row, run.dataset, m, run.seed, _run_values(run).get(m))
        for row, run in pairs
        if run.dataset in datasets
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
    rows = ablation_rows()
    return _variant_table(
        "table4_ablation",
        "Ablation of GR4CIL's components (%), 10 tasks.",
        _variant_rows(inputs, rows),
        list(rows),
        ("avg_acc", "last_acc", "avg_auroc", "last_auroc"),
    )


def table5_compensation(inputs: ReportInputs) -> ReportTable:
    rows = compensation_rows()
    return _variant_table(
        "table5_compensation",
        "Compensation head: orthogonal constraint (Orth) and "
        "prototype initialisation (Proto), accuracy (%), 10 tasks.",
        _variant_rows(inputs, rows),
        list(rows),
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
    without = _variant_rows(inputs, {"w/o": suite_setting(*WITHOUT_LOSSES_RUN)})
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
    runs = [r for r in _runs_with(inputs, 10) if r.strategy == "gr4cil"]
    records = [
        (r.label, r.dataset, "anchor_preservation", r.seed, (r.diagnostics or {}).get("anchor_preservation"))
        for r in runs
    ]
    columns = [(d, "anchor_preservation") for d in ordered_datasets(r.dataset for r in runs)]
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
    "table_forgetting": table_forgetting,
    "table3_zeroshot": table3_zeroshot,
    "table3_subspace": table3_subspace,
    "table4_ablation": table4_ablation,
    "table5_compensation": table5_compensation,
    "table_anchor": table_anchor,
    "table_adjacent_subspace": table_adjacent_subspace,
    "table_tau": table_tau,
    "table_beta_gamma": table_beta_gamma,
}
