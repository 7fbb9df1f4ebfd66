"""A half-base run (B50-Inc10: 6 tasks) is its own column, panel and file in the analysis, never
mixed with a run of as many equal tasks, and never read as one by the paper's 10-task tables."""

import json

import pytest

from analysis import figures
from analysis.paper_inputs import MissingInputs, ReportInputs, split_of
from analysis.paper_tables import _runs_with, table2_seq
from analysis.tables import write_tables
from benchmarks.data.splits import tasks_label
from benchmarks.runner.results import RunKey
from tests.analysis.records import run_result, stage_result
from tests.analysis.test_tables import _result


def test_tasks_labels_name_equal_tasks_and_splits_apart():
    assert tasks_label(10) == "T=10" and tasks_label(6, "B50-Inc10") == "B50 Inc10"
    assert figures._tasks_title(6, "B50-Inc10") == "B50 Inc10 (6 tasks)"
    assert figures._tasks_title(6, "") == "6 tasks"


def test_the_table_gives_a_split_its_own_column(tmp_path):
    files = {  # (stem, n_tasks, split, accuracies at the two stages)
        "T10-seed0": (10, "", [90.0, 80.0]),
        "B50-Inc10-T6-seed0": (6, "B50-Inc10", [70.0, 60.0]),
        "T6-seed0": (6, "", [50.0, 20.0]),  # as many tasks, equal: another column
    }
    for stem, (n_tasks, split, accs) in files.items():
        result = _result("gr4cil", "cifar100", 0, accs, accs[1], n_tasks=n_tasks)
        config = {"strategy": "gr4cil", "dataset": "cifar100", "n_tasks": n_tasks, "seed": 0}
        result["config"] = {**config, "class_order": "seed1993", **({"split": split} if split else {})}
        path = tmp_path / "cifar100" / "gr4cil" / f"{stem}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result))
    header, _, row = write_tables(tmp_path).splitlines()[:3]
    assert "cifar100 (T=10) Avg" in header and "cifar100 (T=6) Avg" in header
    assert "cifar100 (B50 Inc10) Avg" in header
    cells = dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in row.split("|")]))
    # each cell is its own run's (n = 1): 65 = mean(70, 60); the T=6 run's 35 stays apart
    assert cells["cifar100 (B50 Inc10) Avg"] == "65.00 (n = 1)"
    assert cells["cifar100 (T=6) Avg"] == "35.00 (n = 1)"
    assert cells["cifar100 (B50 Inc10) Last"] == "60.00 (n = 1)"


def test_only_equal_tasks_feed_the_papers_task_count_tables():
    ten = run_result("gr4cil", "imagenet_r", 10, summary={"last_acc": 80.0})
    half = run_result("gr4cil", "imagenet_r", 10, config={"split": "B110-Inc10"}, summary={"last_acc": 50.0})
    five = run_result("gr4cil", "imagenet_r", 5, config={"split": "B120-Inc20"}, summary={"last_acc": 1.0})
    inputs = ReportInputs([ten, half, five], [ten, half, five])
    assert [split_of(r) for r in (ten, half)] == ["", "B110-Inc10"]
    assert _runs_with(inputs, 10) == [ten]
    with pytest.raises(MissingInputs, match="no 5- or 20-task runs"):  # 5 tasks, but not equal ones
        table2_seq(inputs)


def test_a_half_base_runs_figures_say_its_split():
    run = run_result("gr4cil", "cifar100", 6, config={"split": "B50-Inc10"}, stages=[stage_result(1, 50.0)])
    assert figures._run_title(run) == "gr4cil, CIFAR-100, B50 Inc10, seed 0"
    key = RunKey("gr4cil", "cifar100", 6, 0, "B50-Inc10")
    assert figures._file_stem(key) == "cifar100_gr4cil_B50-Inc10_T6_seed0"
    assert figures._file_stem(RunKey("gr4cil", "cifar100", 10, 0)) == "cifar100_gr4cil_T10_seed0"


def test_comparisons_pair_a_half_base_run_only_with_the_same_split(tmp_path):
    """A B50-Inc10 run (6 tasks) and a T6 run share a task count but not a stream: ``load_runs``
    keeps them in two groups, the split's named as the comparison names it."""
    from analysis.paired_runs import load_runs

    for stem, split in (("B50-Inc10-T6-seed0", "B50-Inc10"), ("T6-seed0", "")):
        for label in ("gr4cil", "finetune"):
            result = _result(label, "cifar100", 0, [70.0, 60.0], 60.0, n_tasks=6)
            config = {"strategy": label, "dataset": "cifar100", "n_tasks": 6, "seed": 0}
            result["config"] = {**config, "class_order": "seed1993", **({"split": split} if split else {})}
            path = tmp_path / "cifar100" / label / f"{stem}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result))
    runs = load_runs(tmp_path, problems := [])
    assert not problems
    assert sorted(runs) == [
        ("cifar100", 6, "finetune"),
        ("cifar100", 6, "gr4cil"),
        ("cifar100 (B50 Inc10)", 6, "finetune"),
        ("cifar100 (B50 Inc10)", 6, "gr4cil"),
    ]
    assert all(len(units) == 1 for units in runs.values())
