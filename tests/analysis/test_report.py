"""The report: every table equals the aggregate of its JSON inputs, LaTeX is well-formed, marks sit
on the best entries, figures are images of the expected size, and missing inputs are skipped."""

import csv
import io
import json
import re
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest

from analysis import figure_style, figures
from analysis.gr4cil_settings import gr4cil_defaults
from analysis.paper_inputs import REFERENCE_FILE, load_inputs, load_paper_reference, row_label
from analysis.report import build_report
from analysis.report import main as report_main
from benchmarks.runner.result_record import config_hash

DATASETS = ("cifar100", "imagenet_r", "imagenet100", "imagenet1k")
NAMES = {
    "cifar100": "CIFAR-100",
    "imagenet_r": "ImageNet-R",
    "imagenet100": "ImageNet-100",
    "imagenet1k": "ImageNet-1K",
    "pets": "Pets",
    "food101": "Food-101",
}
# Ablation fixtures: label -> (expected row of each table, options). Labels are deliberately
# unrelated to the rows: the report must find rows from the configs.
ABLATIONS = {
    "v01": (
        {"table4_ablation": "Base"},
        {
            "use_anchor_loss": False,
            "use_separation_loss": False,
            "compensation": "off",
            "use_prototype_score": False,
            "tau": 0.3,
        },
    ),
    "v02": (
        {"table4_ablation": "+ L_anc and L_sep"},
        {"compensation": "off", "use_prototype_score": False, "compensation_init": "random"},
    ),
    "v03": ({"table4_ablation": "+ Compensation term"}, {"use_prototype_score": False, "gamma": 0.9}),
    "v04": (
        {"table5_compensation": "Orth ×, Proto ×"},
        {"compensation": "unconstrained", "compensation_init": "random"},
    ),
    "v05": ({"table5_compensation": "Orth ✓, Proto ×"}, {"compensation_init": "random"}),
    "v06": ({"table5_compensation": "Orth ×, Proto ✓"}, {"compensation": "unconstrained"}),
    "v07": ({"table_tau": "τ=0.5", "table_adjacent_subspace": "τ=0.5"}, {"tau": 0.5}),
    "v08": ({"table_tau": "τ=0.6", "table_adjacent_subspace": "τ=0.6"}, {"tau": 0.6}),
    "v09": ({"table_tau": "τ=0.8", "table_adjacent_subspace": "τ=0.8"}, {"tau": 0.8}),
    "v10": ({"table_beta_gamma": "(β,γ)=(0.1,0.1)"}, {"beta": 0.1, "gamma": 0.1}),
    "v11": ({"table_beta_gamma": "(β,γ)=(0.5,0.2)"}, {"beta": 0.5}),
    "v12": ({"table_adjacent_subspace": "w/o"}, {"use_anchor_loss": False, "use_separation_loss": False}),
    "v13": ({}, {"tau": 0.5, "beta": 0.1}),  # two switches changed: in no sweep table
}
# Rows the default GR4CIL configuration fills in the config-identified tables.
DEFAULT_ROWS = {
    "table4_ablation": "+ Prototype term (Full model)",
    "table5_compensation": "Orth ✓, Proto ✓",
    "table_tau": "τ=0.7",
    "table_adjacent_subspace": "τ=0.7",
    "table_beta_gamma": "(β,γ)=(0.2,0.2)",
}


def _result(label, dataset, n_tasks, seed, rng, strategy=None, options=None, zero_shot=None, per_task=True):
    strategy = strategy or label
    gr4cil = strategy == "gr4cil"
    accs = sorted(rng.uniform(50, 95, n_tasks).round(3), reverse=True)
    stages = []
    for t in range(1, n_tasks + 1):
        diagnostics = {}
        if gr4cil:
            diagnostics = {
                f"routing_acc_{k}": float(rng.uniform(60, 99))
                for k in ("full", "without_compensation", "text_only", "text_prototype")
            }
            diagnostics.update(
                {
                    "confidence_with_compensation": float(rng.uniform(0.7, 0.9)),
                    "confidence_without_compensation": float(rng.uniform(0.5, 0.7)),
                    "margin_with_compensation": None if t == 1 else float(rng.uniform(0.02, 0.05)),
                    "margin_without_compensation": None if t == 1 else float(rng.uniform(0.0, 0.02)),
                }
            )
        last = t == n_tasks
        stages.append(
            {
                "task": t,
                "acc": accs[t - 1],
                "acc_per_task": list(rng.uniform(40, 99, t).round(2)) if per_task else [],
                "n_test_per_task": [20] * t,
                "routing_acc": float(rng.uniform(60, 99)),
                "auroc": None if last else float(rng.uniform(60, 95)),
                "fpr95": None if last else float(rng.uniform(20, 60)),
                "diagnostics": diagnostics,
            }
        )
    aurocs = [s["auroc"] for s in stages[:-1]]
    summary = {
        "avg_acc": float(np.mean(accs)),
        "last_acc": accs[-1],
        "avg_auroc": float(np.mean(aurocs)) if aurocs else None,
        "last_auroc": aurocs[-1] if aurocs else None,
    }
    diagnostics = {}
    if gr4cil:
        per_task = [{k: float(rng.uniform(0.1, 0.9)) for k in ("I-T", "I-C", "I-TC")} for _ in range(n_tasks)]
        diagnostics = {
            "anchor_preservation": float(rng.uniform(0.98, 1.0)),
            "subspace_distance": {
                k: float(np.mean([d[k] for d in per_task])) for k in ("I-T", "I-C", "I-TC")
            },
            "subspace_distance_per_task": per_task,
            "adjacent_text_distance": float(rng.uniform(0.8, 0.95)),
            "adjacent_compensation_distance": float(rng.uniform(0.8, 0.95)),
            "modality_gap": [
                [
                    {
                        "epoch": e,
                        "overall": 0.3 - 0.01 * e + 0.01 * t,
                        "positive": 0.33 - 0.002 * e,
                        "negative": 0.29 - 0.012 * e,
                    }
                    for e in range(1, 6)
                ]
                for t in range(n_tasks)
            ],
            "thresholds": [None] * n_tasks,
            "eval_branch_forwards": 100,
        }
    strategy_config = {"epochs": 2, **(gr4cil_defaults() if gr4cil else {}), **(options or {})}
    config = {"strategy_config": strategy_config, **({"zero_shot": sorted(zero_shot)} if zero_shot else {})}
    result = {
        "schema_version": 1,
        "strategy": strategy,
        "label": label,
        "dataset": dataset,
        "n_tasks": n_tasks,
        "seed": seed,
        "config": config,
        "config_hash": config_hash(config),
        "class_order": [],
        "tasks": [],
        "stages": stages,
        "summary": summary,
        "diagnostics": diagnostics,
        "env": {},
        "cost": {
            "train_seconds": 1.0,
            "eval_seconds": 1.0,
            "trainable_params": int(rng.integers(1e5, 1e7)),
            "peak_memory_bytes": int(rng.integers(2**28, 2**32)),
            "peak_memory_kind": "cuda_allocated",
        },
    }
    if zero_shot is not None:
        result["zero_shot"] = zero_shot
    return result


def _with_accuracies(result: dict, avg: float, last: float) -> dict:
    """``result`` with stage accuracies whose mean is ``avg`` and last is ``last``, its summary theirs."""
    n = len(result["stages"])
    accs = [(avg * n - last) / (n - 1)] * (n - 1) + [last]
    stages = [{**stage, "acc": acc} for stage, acc in zip(result["stages"], accs)]
    return {**result, "stages": stages, "summary": {**result["summary"], "avg_acc": avg, "last_acc": last}}


def _write(root, result, folder=""):
    """``result`` where the runner stores it, its config hash that of its config as the runner's is."""
    result = {**result, "config_hash": config_hash(result["config"])}
    path = Path(
        root, folder, result["dataset"], result["label"], f"T{result['n_tasks']}-seed{result['seed']}.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result))


def make_fixtures(root):
    """Write a results folder covering every table and figure; return the results by role."""
    rng = np.random.default_rng(0)
    runs = {"main": [], "seq": [], "ablation": [], "zero_shot": []}
    for dataset in DATASETS:
        runs["main"] += [_result("gr4cil", dataset, 10, s, rng) for s in (0, 1)]
        runs["main"].append(_result("continual_clip", dataset, 10, 0, rng, per_task=False))
    runs["main"].append(_result("gr4cil", "cifar100", 10, 2, rng))  # a seed without the other datasets
    runs["main"] += [
        _result("my_new_method", d, 10, 0, rng, per_task=False)  # a user's strategy
        for d in ("cifar100", "imagenet_r")
    ]
    runs["seq"] = [
        _result("gr4cil", "cifar100", 5, 0, rng),
        _result("gr4cil", "cifar100", 5, 1, rng),
        _result("continual_clip", "cifar100", 20, 0, rng),
        _result("gr4cil", "imagenet_r", 20, 0, rng),
    ]
    for label, (_, options) in ABLATIONS.items():
        seeds = (0, 1) if label in ("v01", "v07") else (0,)
        # Without acc_per_task (as the baselines above): fewer heat maps keep the test fast, and
        # the report must skip such runs.
        runs["ablation"] += [
            _result(label, "cifar100", 10, s, rng, "gr4cil", options, per_task=False) for s in seeds
        ]
    # The "full" row of an ablation suite: the default configuration again, same numbers as the
    # main run with that seed; it must not count twice in default-config tables.
    runs["ablation"] += [
        dict(r, label="full")
        for r in runs["main"]
        if r["label"] == "gr4cil" and r["dataset"] == "cifar100" and r["seed"] < 2
    ]
    for dataset in ("cifar100", "imagenet_r"):
        zs = {
            t: {
                "clip": float(rng.uniform(60, 85)),
                "fusion": float(rng.uniform(60, 88)),
                "routed": float(rng.uniform(60, 88)),
                "n_test": 100,
                "unknown_rate": 10.0,
            }
            for t in ("pets", "food101", "imagenet1k")
        }
        # Same key as a main run (label gr4cil, seed 0) but trained with held-out images.
        runs["zero_shot"].append(
            _result("gr4cil", dataset, 10, 0, rng, options={"threshold_holdout": 0.1}, zero_shot=zs)
        )
    for role, results in runs.items():
        for result in results:
            _write(root, result, "zeroshot" if role == "zero_shot" else "")
    return runs


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    runs = make_fixtures(root)
    out = tmp_path_factory.mktemp("report")
    notes = []
    items = build_report(root, out, log=notes.append)
    return {"runs": runs, "items": {i.name: i for i in items}, "out": out, "notes": notes, "root": root}


def _csv(report, name):
    """{row: {column: cell}} and {row: kind} of a written table."""
    rows = list(csv.reader(io.StringIO((report["out"] / "tables" / f"{name}.csv").read_text())))
    header = rows[0]
    cells = {r[0]: dict(zip(header[2:], r[2:])) for r in rows[1:]}
    return cells, {r[0]: r[1] for r in rows[1:]}


def _cell(values, decimals=2):
    if len(values) == 1:
        return f"{values[0]:.{decimals}f} (n = 1)"
    return f"{np.mean(values):.{decimals}f} ± {np.std(values):.{decimals}f}"


def _check(report, name, expected, decimals=2):
    """The table's reproduced cells are exactly ``expected`` ({(row, column): [values]}); every
    other reproduced cell is empty."""
    cells, kinds = _csv(report, name)
    got = {
        (row, col): v
        for row, cols in cells.items()
        if kinds[row] == "reproduced"
        for col, v in cols.items()
        if v != "–"
    }
    assert got == {key: _cell(values, decimals) for key, values in expected.items()}


def _add(expected, row, column, value):
    """Expect ``value`` in the cell of run label ``row`` (shown under its docs/decisions.md D9 row label)."""
    expected.setdefault((row_label(row), column), []).append(value)


@pytest.mark.slow
def test_every_table_and_figure_is_written(report):
    skipped = {name: item.skipped for name, item in report["items"].items() if not item.written}
    assert skipped == {}
    assert (report["out"] / "report.md").read_text().count("[paper]") > 10
    # The zero-shot runs share keys with main runs: the note says which file the tables use.
    assert len(report["notes"]) == 2 and all("\n" not in n for n in report["notes"])


@pytest.mark.slow
def test_against_gr4cil_pairs_every_strategy_with_gr4cil_on_its_shared_seeds(report):
    table = pd.read_csv(report["out"] / "tables" / "against_gr4cil-last.csv")
    main = report["runs"]["main"]
    last = {(r["label"], r["dataset"], r["seed"]): r["summary"]["last_acc"] for r in main}
    for row in table[table["method"].isin(["continual_clip", "my_new_method"])].itertuples():
        seeds = [int(s) for s in str(row.paired_seeds).split()]
        expected = np.mean(
            [last[(row.method, row.dataset, s)] - last[("gr4cil", row.dataset, s)] for s in seeds]
        )
        assert seeds == [0] and row.difference == pytest.approx(expected)
        assert row.verdict == "no interval"  # one seed and no stored predictions: nothing to resample
    assert set(table["method"]) >= {"continual_clip", "my_new_method", "full", "v01"}
    text = (report["out"] / "report.md").read_text()
    assert "# Last accuracy (%) against gr4cil" in text and "# Avg accuracy (%) against gr4cil" in text


@pytest.mark.slow
def test_table1_cells_are_mean_and_std_over_seeds(report):
    expected, per_seed = {}, {}
    for r in report["runs"]["main"] + report["runs"]["ablation"]:
        for metric, name in (("avg_acc", "Avg"), ("last_acc", "Last")):
            _add(expected, r["label"], f"{NAMES[r['dataset']]} {name}", r["summary"][metric])
        per_seed.setdefault((r["label"], r["seed"]), {})[r["dataset"]] = r["summary"]
    for (label, _), summaries in per_seed.items():
        if len(summaries) == 4:  # the average needs every dataset of the table
            _add(expected, label, "Average Avg-Acc", np.mean([s["avg_acc"] for s in summaries.values()]))
            _add(expected, label, "Average Last-Acc", np.mean([s["last_acc"] for s in summaries.values()]))
    _check(report, "table1_main", expected)
    cells, kinds = _csv(report, "table1_main")
    assert cells["my_new_method"]["Average Avg-Acc"] == "–"  # ran on two datasets only


@pytest.mark.slow
def test_seq_and_ood_tables(report):
    expected = {}
    for r in report["runs"]["seq"]:
        _add(expected, r["label"], f"{NAMES[r['dataset']]} {r['n_tasks']}-task", r["summary"]["last_acc"])
    _check(report, "table2_seq", expected)
    expected = {}
    for r in report["runs"]["main"] + report["runs"]["ablation"]:
        for metric, name in (("avg_auroc", "Avg-AUROC"), ("last_auroc", "Last-AUROC")):
            _add(expected, r["label"], f"{NAMES[r['dataset']]} {name}", r["summary"][metric])
    _check(report, "table2_ood", expected)


@pytest.mark.slow
def test_zero_shot_and_subspace_tables(report):
    expected = {}
    for r, row in zip(report["runs"]["zero_shot"], ("GR4CIL i", "GR4CIL ii")):
        for target, accs in r["zero_shot"].items():
            _add(expected, "CLIP", NAMES[target], accs["clip"])
            _add(expected, row, NAMES[target], accs["fusion"])
    _check(report, "table3_zeroshot", expected)
    expected = {}
    for r in report["runs"]["main"]:
        if r["label"] == "gr4cil":  # the "full" duplicates must not count twice
            for name, value in r["diagnostics"]["subspace_distance"].items():
                _add(expected, name, NAMES[r["dataset"]], value)
    _check(report, "table3_subspace", expected, decimals=3)


@pytest.mark.slow
def test_anchor_table_has_one_row_per_gr4cil_label(report):
    expected = {}
    for r in report["runs"]["main"] + report["runs"]["ablation"]:
        if r["strategy"] == "gr4cil":
            _add(expected, r["label"], NAMES[r["dataset"]], r["diagnostics"]["anchor_preservation"])
    _check(report, "table_anchor", expected, decimals=4)


@pytest.mark.slow
@pytest.mark.parametrize(
    "table, metrics, decimals",
    [
        (
            "table4_ablation",
            {
                "Avg-Acc": "avg_acc",
                "Last-Acc": "last_acc",
                "Avg-AUROC": "avg_auroc",
                "Last-AUROC": "last_auroc",
            },
            2,
        ),
        ("table5_compensation", {"Avg-Acc": "avg_acc", "Last-Acc": "last_acc"}, 2),
        ("table_tau", {"Avg-Acc": "avg_acc", "Last-Acc": "last_acc", "Last-Routing Acc": "routing"}, 2),
        (
            "table_beta_gamma",
            {"Avg-Acc": "avg_acc", "Last-Acc": "last_acc", "Last-Routing Acc": "routing"},
            2,
        ),
        (
            "table_adjacent_subspace",
            {
                "Compensation-space distance": "adjacent_compensation_distance",
                "Text-space distance": "adjacent_text_distance",
            },
            4,
        ),
    ],
)
def test_config_identified_rows(report, table, metrics, decimals):
    rows = [
        (ABLATIONS[r["label"]][0].get(table), r)
        for r in report["runs"]["ablation"]
        if r["label"] in ABLATIONS
    ]
    rows += [
        (DEFAULT_ROWS[table], r)
        for r in report["runs"]["main"]
        if r["label"] == "gr4cil" and r["dataset"] == "cifar100"
    ]
    expected = {}
    for row, r in rows:
        if row is None:
            continue
        values = {**r["summary"], **r["diagnostics"], "routing": r["stages"][-1]["routing_acc"]}
        for column, key in metrics.items():
            _add(expected, row, f"CIFAR-100 {column}", values[key])
    _check(report, table, expected, decimals)


@pytest.mark.slow
def test_rows_follow_the_paper_order(report):
    def reproduced(name):
        return [row for row, kind in _csv(report, name)[1].items() if kind == "reproduced"]

    assert reproduced("table4_ablation") == [
        "Base",
        "+ L_anc and L_sep",
        "+ Compensation term",
        "+ Prototype term (Full model)",
    ]
    assert reproduced("table_tau") == ["τ=0.5", "τ=0.6", "τ=0.7", "τ=0.8"]
    assert reproduced("table_adjacent_subspace") == ["w/o", "τ=0.5", "τ=0.6", "τ=0.7", "τ=0.8"]
    assert reproduced("table_beta_gamma") == ["(β,γ)=(0.1,0.1)", "(β,γ)=(0.2,0.2)", "(β,γ)=(0.5,0.2)"]
    assert reproduced("table3_zeroshot") == ["CLIP", "GR4CIL i", "GR4CIL ii"]


@pytest.mark.slow
def test_paper_rows_and_differences(report):
    cells, kinds = _csv(report, "table1_main")
    assert kinds["GR4CIL (Ours) [paper]"] == "paper" and kinds["GR4CIL Δ"] == "delta"  # D9 labels
    assert cells["GR4CIL (Ours) [paper]"]["CIFAR-100 Avg"] == "89.35 ± 0.26"
    assert cells["GR4CIL (Ours) [paper]"]["Average Avg-Acc"] == "87.47"  # all four datasets present
    assert cells["Continual-CLIP [paper]"]["ImageNet-R Last"] == "72.00"
    assert cells["L2P++ [paper]"]["ImageNet-1K Avg"] == "79.30"  # a baseline we did not run
    mean = float(cells["GR4CIL"]["CIFAR-100 Avg"].split(" ± ")[0])
    assert float(cells["GR4CIL Δ"]["CIFAR-100 Avg"]) == pytest.approx(mean - 89.35, abs=0.011)
    assert kinds["Continual-CLIP"] == "reproduced" and "continual_clip" not in cells
    assert "my_new_method Δ" not in cells  # no paper row to compare with
    seq, _ = _csv(report, "table2_seq")
    assert seq["GR4CIL (Ours) [paper]"]["CIFAR-100 5-task"] == "84.98"  # printed as "Ours"
    tau, _ = _csv(report, "table_tau")
    assert tau["τ=0.6 [paper]"]["CIFAR-100 Last-Routing Acc"] == "83.68"


def test_without_paper_there_are_only_reproduced_rows(tmp_path):
    root = tmp_path / "results"
    _write(root, _result("gr4cil", "cifar100", 10, 0, np.random.default_rng(1)))
    build_report(root, tmp_path / "out", with_paper=False, only=["table1_main"])
    rows = list(csv.reader(io.StringIO((tmp_path / "out/tables/table1_main.csv").read_text())))
    assert [r[:2] for r in rows[1:]] == [["GR4CIL", "reproduced"]]


@pytest.mark.slow
def test_latex_is_well_formed(report):
    for path in sorted((report["out"] / "tables").glob("*.tex")):
        tex = path.read_text()
        assert tex.count("{") == tex.count("}"), path.name
        assert (
            "\\toprule" in tex and "\\bottomrule" in tex and "\\begin{table}" in tex and "\\end{table}" in tex
        )
        spec = re.search(r"\\begin\{tabular\}\{(l)(c+)\}", tex)
        n_columns = 1 + len(spec.group(2))
        body = tex.split("\\toprule")[1].split("\\bottomrule")[0]
        rows = [
            line
            for line in body.strip().splitlines()
            if line not in ("\\midrule",) and not line.startswith("\\cmidrule")
        ]
        for row in rows:
            assert row.count("\\\\") == 1 and row.endswith("\\\\"), (path.name, row)
            spans = sum(int(s) - 1 for s in re.findall(r"\\multicolumn\{(\d+)\}", row))
            assert row.count("&") + 1 + spans == n_columns, (path.name, row)


def _md_rows(report, name):
    lines = (report["out"] / "tables" / f"{name}.md").read_text().splitlines()
    table = [line for line in lines if line.startswith("| ")]
    header = [c.strip() for c in table[0].split("|")[1:-1]]
    return header, {
        cells[0]: cells[1:] for cells in ([c.strip() for c in line.split("|")[1:-1]] for line in table[1:])
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, lower_is_better",
    [
        ("table1_main", False),
        ("table2_ood", False),
        ("table_tau", False),
        ("table3_subspace", True),
        ("table_adjacent_subspace", True),
    ],
)
def test_bold_and_italic_mark_best_and_second_best(report, name, lower_is_better):
    header, rows = _md_rows(report, name)
    _, kinds = _csv(report, name)
    reproduced = {row: cells for row, cells in rows.items() if kinds[row] == "reproduced"}
    for j in range(len(header) - 1):
        values = {row: cells[j] for row, cells in reproduced.items() if cells[j] != "–"}
        means = {row: float(v.strip("*").split(" ± ")[0].split(" (n = ")[0]) for row, v in values.items()}
        ranked = sorted(set(means.values()), reverse=not lower_is_better)
        for row, value in values.items():
            if means[row] == ranked[0]:
                assert value.startswith("**") and value.endswith("**"), (row, value)
            elif len(ranked) > 1 and means[row] == ranked[1]:
                assert value.startswith("*") and not value.startswith("**"), (row, value)
            else:
                assert not value.startswith("*"), (row, value)
        for row, cells in rows.items():  # paper and difference rows carry no marks
            if kinds[row] != "reproduced":
                assert not cells[j].startswith("*")
    tex = (report["out"] / "tables" / f"{name}.tex").read_text()
    assert "\\textbf{" in tex and "\\textit{" in tex


@pytest.mark.slow
def test_figures_are_images_of_the_expected_size(report):
    panels = {
        "fig7_routing": 4,  # default GR4CIL 10-task runs on four datasets
        "fig_accuracy_curves": 7,
    }  # (dataset, tasks): CIFAR-100 5/10/20, ImageNet-R 10/20, ImageNet-100/1K 10
    n_runs = 0
    for name, item in report["items"].items():
        if item.kind != "figure":
            continue
        size = figure_style.panel_figsize(panels[name]) if name in panels else figures.FIGSIZES[name]
        for path in item.paths:
            assert path.stat().st_size > 1000, path
            if path.suffix == ".png":
                height, width = mpimg.imread(path).shape[:2]
                assert (width, height) == (
                    round(size[0] * figure_style.DPI),
                    round(size[1] * figure_style.DPI),
                ), path.name
            else:
                assert path.read_bytes()[:4] == b"%PDF"
        if name == "acc_matrix":
            n_runs = len(item.paths) // 2
    # one heat map per result with acc_per_task (not the zero-shot runs: their keys are taken)
    assert n_runs == sum(
        1
        for role, runs in report["runs"].items()
        if role != "zero_shot"
        for r in runs
        if r["stages"][0]["acc_per_task"]
    )


@pytest.mark.slow
def test_missing_inputs_are_one_line_skips(tmp_path, capsys):
    root = tmp_path / "results"
    _write(root, _result("continual_clip", "cifar100", 10, 0, np.random.default_rng(2)))
    _write(root, _result("my_new_method", "cifar100", 10, 0, np.random.default_rng(3)))
    assert report_main(["--results-dir", str(root), "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err.splitlines()
    skipped = {line.split(":")[0].removeprefix("skipped ") for line in err}
    assert skipped == {
        "table2_seq",
        "table3_zeroshot",
        "table3_subspace",
        "table4_ablation",
        "table5_compensation",
        "table_anchor",
        "table_adjacent_subspace",
        "table_tau",
        "table_beta_gamma",
        "fig2_gap_training",
        "fig3_gap_final",
        "fig5_confidence_margin",
        "fig7_routing",
        "against_gr4cil",
    }  # no GR4CIL run to compare with
    cells, kinds = _csv({"out": tmp_path / "out"}, "table1_main")
    assert kinds["my_new_method"] == "reproduced" and kinds["Continual-CLIP"] == "reproduced"
    assert (tmp_path / "out/figures/fig_accuracy_curves.png").exists()


def test_empty_folder_is_a_one_line_error(tmp_path, capsys):
    assert report_main(["--results-dir", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_reference_numbers():
    paper = load_paper_reference().set_index(["source", "row", "group", "metric"])
    assert paper.loc[("tab:main_results", "L2P++", "cifar100", "avg_acc"), "value"] == 81.90
    assert paper.loc[("tab:main_results", "GR4CIL (Ours)", "imagenet1k", "last_acc"), "std"] == 0.31
    assert paper.loc[("tab:ood_detection", "GR4CIL (Ours)", "imagenet_r", "last_auroc"), "value"] == 83.09
    assert paper.loc[("tab:subspace_distance", "I-TC", "imagenet100", "distance"), "value"] == 0.420
    assert (
        paper.loc[("tab:adjacent_subspace_distance", "w/o", "cifar100", "adjacent_text_distance"), "value"]
        == 0.8860
    )
    assert (
        paper.loc[("tab:beta_gamma_analysis", "(β,γ)=(0.5,0.2)", "cifar100", "last_routing_acc"), "value"]
        == 83.40
    )


TEX = Path(__file__).resolve().parents[3] / "shared" / "paper" / "GR4CIL.tex"


@pytest.mark.skipif(not TEX.exists(), reason="the paper's tex is not next to the repository")
def test_every_reference_number_is_printed_in_its_source_table():
    tex = TEX.read_text()
    for record in csv.DictReader(REFERENCE_FILE.open()):
        at = tex.index(f"\\label{{{record['source']}}}")
        start, env = max(
            (tex.rfind(f"\\begin{{{e}}}", 0, at), e) for e in ("subtable", "table", "table*", "minipage")
        )
        block = tex[start : tex.index(f"\\end{{{env}}}", at)]
        numbers = re.findall(r"[+]?\d+\.\d+", block)
        assert record["value"] in numbers, record
        assert not record["std"] or record["std"] in numbers, record


@pytest.mark.slow
def test_cost_figure_has_every_method_that_ran_under_its_paper_label(report):
    dataset, frame = figures.cost_frame(load_inputs(report["root"]))
    assert dataset == "cifar100"  # where most labels ran
    labels = {
        r["label"]
        for role in ("main", "ablation")
        for r in report["runs"][role]
        if r["dataset"] == "cifar100"
    }
    assert set(frame["label"]) == {row_label(label) for label in labels}
    assert {"GR4CIL", "Continual-CLIP", "my_new_method"} <= set(frame["label"])


def test_reproducibility_has_one_row_per_strategy_and_fills_real_data_from_results(tmp_path):
    from analysis.reproducibility import reproducibility_markdown
    from strategies.registry import available

    empty = reproducibility_markdown(tmp_path / "none")
    rows = [line for line in empty.splitlines() if line.startswith("| `")]
    assert sorted(line.split("`")[1] for line in rows) == sorted(available())
    assert all(line.rstrip().endswith("| not yet run |") for line in rows)
    for paper_row in (
        "L2P++",
        "DualPrompt",
        "CODA",
        "Aper-Adapter",
        "CLAP",
        "AdapterVLM",
        "MG-CLIP",
        "MOE4CL",
        "MagMax",
        "Continual-CLIP",
        "GR4CIL",
    ):
        assert f"| {paper_row} |" in empty
    assert "CIFAR-100 81.90 / 73.08" in empty  # L2P++'s Table 1 cell
    rng = np.random.default_rng(0)
    runs = [_result("l2p_pp", "cifar100", 10, seed, rng) for seed in (0, 1)]
    for run in runs:
        _write(tmp_path / "results", run)
    _write(tmp_path / "results", _result("l2p_pp", "synthetic", 10, 0, rng))
    filled = reproducibility_markdown(tmp_path / "results")
    (row,) = [line for line in filled.splitlines() if line.startswith("| `l2p_pp`")]
    avg = np.mean([r["summary"]["avg_acc"] for r in runs])
    last = np.mean([r["summary"]["last_acc"] for r in runs])
    assert f"CIFAR-100 {avg:.2f} / {last:.2f} (2 seeds)" in row and "miniature" in row


def test_reproducibility_reads_each_cell_from_the_suite_it_names(tmp_path):
    """A folder of suites' folders: the miniature cells read smoke-baselines', the real-data cells
    main's; a synthetic run in any other folder (``mine``, another suite) moves no cell, and is named."""
    from analysis.reproducibility import reproducibility_markdown

    rng = np.random.default_rng(0)
    baselines = [
        _as_the_suites(_result("finetune", "synthetic", 10, s, rng), "smoke-baselines") for s in (0, 1)
    ]
    for result in baselines:
        _write(tmp_path / "results", result, "smoke-baselines")
    real = _as_the_suites(_result("finetune", "cifar100", 10, 0, rng), "main")
    _write(tmp_path / "results", real, "main")
    _write(tmp_path / "results", _result("finetune", "synthetic", 10, 2, rng), "mine")
    _write(tmp_path / "results", _result("finetune", "cifar100", 10, 1, rng), "smoke-official-steps")
    text = reproducibility_markdown(tmp_path / "results")
    (row,) = [line for line in text.splitlines() if line.startswith("| `finetune`")]
    assert "(n = 2)" in row  # the two smoke-baselines seeds, not the third in mine/
    summary = real["summary"]
    assert f"CIFAR-100 {summary['avg_acc']:.2f} / {summary['last_acc']:.2f} (1 seed)" in row
    assert (
        "Not counted: the results of `mine`, `smoke-official-steps` under `results/`: the miniature cells "
        "read `smoke-baselines`'s and the real-data cells `main`'s alone."
    ) in text


def _as_the_suites(result: dict, suite: str) -> dict:
    """``result`` with the config ``suite`` now gives its run (as the runner records it)."""
    from benchmarks.backbone import recorded_backbone
    from benchmarks.runner.suites import expand, load_suite

    (spec,) = [
        spec
        for spec in expand(load_suite(suite), strategies=[result["strategy"]], seeds=[result["seed"]])
        if spec.dataset == result["dataset"] and spec.n_tasks == result["n_tasks"]
    ]
    return {**result, "config": {**spec.config, "backbone": recorded_backbone(spec.config["backbone"])}}


def test_reproducibility_counts_only_the_runs_of_the_suite_each_cell_names(tmp_path):
    """Under ``results/smoke-baselines/``: a result of another recipe, or of a run the suite does
    not hold (5 tasks), moves no cell, and one line names it."""
    from analysis.reproducibility import reproducibility_markdown

    rng = np.random.default_rng(0)
    root = tmp_path / "results"
    kept = [
        _as_the_suites(_result("gr4cil", "synthetic", 10, seed, rng), "smoke-baselines") for seed in (0, 1)
    ]
    for result in kept:
        _write(root, result, "smoke-baselines")
    text = reproducibility_markdown(root)
    assert "Not counted" not in text
    before = [line for line in text.splitlines() if line.startswith("| `gr4cil`")]

    other_recipe = _result("gr4cil", "synthetic", 10, 2, rng)
    options = kept[0]["config"]["strategy_options"]
    other_recipe["config"] = {**kept[0]["config"], "strategy_options": {**options, "epochs": 12}}
    _write(root, other_recipe, "smoke-baselines")
    _write(root, {**kept[0], "n_tasks": 5, "config": {**kept[0]["config"], "n_tasks": 5}}, "smoke-baselines")
    text = reproducibility_markdown(root)
    assert [line for line in text.splitlines() if line.startswith("| `gr4cil`")] == before  # n = 2, as before
    assert (
        "Not counted: 2 result(s) under `results/smoke-baselines/` that are not `smoke-baselines`'s runs "
        "as it now reads: 1 computed with another checkpoint or recipe than the suite now gives (`gr4cil` "
        "synthetic T10); 1 of a run the suite does not hold (`gr4cil` synthetic T5). `python -m "
        "benchmarks.run --suite smoke-baselines --results-dir results/smoke-baselines --force` recomputes "
        "the suite's runs."
    ) in text


def test_reproducibility_flags_miniature_results_of_another_checkpoint_or_recipe(tmp_path):
    from analysis.reproducibility import reproducibility_markdown
    from benchmarks.backbone import BackboneSpec, weights_digest
    from benchmarks.runner.suites import expand, load_suite

    (spec,) = expand(load_suite("smoke-baselines"), strategies=["gr4cil"], seeds=[0])
    digest = weights_digest(BackboneSpec(spec.backbone["model"], spec.backbone["pretrained"]))
    assert digest and len(digest) == 16
    result = _result("gr4cil", "synthetic", 10, 0, np.random.default_rng(0))
    result["config"] = {**spec.config, "backbone": {**spec.backbone, "weights_sha256": digest}}
    _write(tmp_path / "current", result)
    assert "Stale" not in reproducibility_markdown(tmp_path / "current")

    for name, change in (
        ("checkpoint", {"backbone": {**spec.backbone, "weights_sha256": "0" * 16}}),
        ("recipe", {"strategy_options": {**spec.config["strategy_options"], "epochs": 12}}),
    ):
        _write(tmp_path / name, {**result, "config": {**result["config"], **change}})
        text = reproducibility_markdown(tmp_path / name)
        assert "**Stale:** of the 1 miniature results, 1 were computed with another checkpoint" in text, name

    # a change of a method's training that its config cannot show: by when the result was computed
    (coda,) = expand(load_suite("smoke-baselines"), strategies=["coda_prompt"], seeds=[0])
    stored = _result("coda_prompt", "synthetic", 10, 0, np.random.default_rng(0))
    stored["config"] = {**coda.config, "backbone": {**coda.backbone, "weights_sha256": digest}}
    for started, flagged in (("2026-11-26T01:36:09+00:00", True), ("2026-11-28T00:00:00+00:00", False)):
        _write(tmp_path / started[:10], {**stored, "env": {**stored["env"], "started_at": started}})
        text = reproducibility_markdown(tmp_path / started[:10])
        assert ("1 of `coda_prompt` predate a change of its training: the cosine" in text) is flagged, started


def test_reproducibility_miniature_cell_is_mean_and_population_std_as_in_the_tables(tmp_path):
    from analysis.reproducibility import reproducibility_markdown
    from analysis.tables import accuracy_table, load_runs

    rng = np.random.default_rng(0)
    for seed, (avg, last) in enumerate(((73.16, 58.70), (70.87, 56.40), (72.29, 58.40))):
        result = _with_accuracies(_result("gr4cil", "synthetic", 10, seed, rng), avg, last)
        _write(tmp_path, result)
    # By hand: Avg mean 72.106..., squared deviations 1.109 + 1.530 + 0.034 = 2.672, / 3 -> std 0.944;
    # Last mean 57.833..., 0.751 + 2.054 + 0.321 = 3.127, / 3 -> std 1.021.
    lines = reproducibility_markdown(tmp_path).splitlines()
    (row,) = [line for line in lines if line.startswith("| `gr4cil`")]
    assert "miniature 72.11 ± 0.94 / 57.83 ± 1.02 (n = 3)" in row
    table = accuracy_table(load_runs(tmp_path))
    assert table.loc["gr4cil", ("synthetic", "Avg")] == "72.11 ± 0.94"
    assert table.loc["gr4cil", ("synthetic", "Last")] == "57.83 ± 1.02"


def test_reproducibility_takes_the_miniature_column_from_smoke_baselines_not_another_suites_runs(tmp_path):
    from analysis.reproducibility import reproducibility_markdown

    rng = np.random.default_rng(0)
    kept = _as_the_suites(
        _with_accuracies(_result("gr4cil", "synthetic", 10, 0, rng), 70.0, 60.0), "smoke-baselines"
    )
    _write(tmp_path, kept, folder="smoke-baselines")
    diagnosis = _with_accuracies(_result("gr4cil", "synthetic", 10, 1, rng), 10.0, 5.0)  # another recipe
    _write(tmp_path, diagnosis, folder="smoke-official-steps")
    (row,) = [
        line for line in reproducibility_markdown(tmp_path).splitlines() if line.startswith("| `gr4cil`")
    ]
    assert "miniature 70.00 / 60.00 (n = 1)" in row


@pytest.mark.slow
def test_the_committed_reproducibility_file_is_the_generated_one():
    from analysis.reproducibility import reproducibility_markdown

    root = Path(__file__).resolve().parents[2]
    assert (root / "REPRODUCIBILITY.md").read_text() == reproducibility_markdown(root / "results"), (
        "regenerate it: python -m analysis.reproducibility"
    )


def test_table_one_has_every_row_of_the_papers_table_one_when_every_strategy_ran(tmp_path):
    from strategies.registry import available

    rng = np.random.default_rng(1)
    for name in available():
        for dataset in ("cifar100", "imagenet_r", "imagenet100", "imagenet1k"):
            _write(tmp_path / "results", _result(name, dataset, 10, 0, rng))
    build_report(tmp_path / "results", tmp_path / "out", only=["table1_main"])
    _, rows = _md_rows({"out": tmp_path / "out"}, "table1_main")
    paper = load_paper_reference()
    for paper_row in dict.fromkeys(paper[paper["table"] == "table1_main"]["row"]):
        assert f"{paper_row} [paper]" in rows and f"{paper_row.removesuffix(' (Ours)')} Δ" in rows, paper_row


@pytest.mark.slow
def test_ranking_agreement_by_hand_and_its_bootstrap_over_seeds():
    from analysis.reproducibility import ranking_agreement

    paper = {"a": 80.0, "b": 70.0, "c": 60.0, "d": 50.0}
    same = ranking_agreement({k: [v / 2] for k, v in paper.items()}, paper)
    assert same == (1.0, 1.0, 1.0, 4)  # one seed a row: the interval is the point
    reverse = ranking_agreement({k: [-v] for k, v in paper.items()}, paper)
    assert reverse[0] == -1.0
    # one swapped pair of four rows: 5 concordant, 1 discordant pair, tau = (5 - 1) / 6
    swapped = ranking_agreement({"a": [80.0], "b": [70.0], "c": [50.0], "d": [60.0]}, paper)
    assert swapped[0] == pytest.approx(4 / 6)
    # seeds that straddle the swap: the interval covers both orders and holds the point
    noisy = ranking_agreement(
        {"a": [80.0, 81.0], "b": [70.0, 69.0], "c": [59.0, 52.0], "d": [56.0, 58.0]}, paper, draws=500
    )
    assert noisy[1] <= 4 / 6 + 1e-12 and noisy[2] == 1.0 and noisy[1] <= noisy[0] <= noisy[2]
    assert ranking_agreement({"a": [1.0], "b": [2.0]}, paper) is None  # two rows rank nothing
