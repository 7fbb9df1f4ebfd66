"""The Avg/Last/Forgetting/BWT table equals the aggregate of its JSON inputs."""

import json

import numpy as np
import pytest

from analysis.tables import main as tables_main
from analysis.tables import write_tables


def _result(label, dataset, seed, stage_accs, first_task_after, n_tasks=10):
    """A version-1 result (no forgetting in its summary) of two stages; ``first_task_after``: task 1's
    accuracy at stage 2 (forgetting and BWT average task 1 alone; task 2 makes up the stage mean)."""
    return {
        "schema_version": 1,
        "strategy": label,
        "label": label,
        "dataset": dataset,
        "n_tasks": n_tasks,
        "seed": seed,
        "config": {},
        "class_order": [],
        "tasks": [],
        "stages": [
            _stage(1, stage_accs[0], [stage_accs[0]]),
            _stage(2, stage_accs[1], [first_task_after, 2 * stage_accs[1] - first_task_after]),
        ],
        "summary": {
            "avg_acc": float(np.mean(stage_accs)),
            "last_acc": stage_accs[-1],
            "avg_auroc": None,
            "last_auroc": None,
        },
        "env": {},
        "cost": {},
    }


def _stage(task, acc, acc_per_task):
    return {
        "task": task,
        "acc": acc,
        "acc_per_task": acc_per_task,
        "n_test_per_task": [10] * task,
        "routing_acc": 100.0,
        "auroc": None,
        "fpr95": None,
        "diagnostics": {},
    }


@pytest.fixture
def results_dir(tmp_path):
    rows = [
        ("gr4cil", "cifar100", 0, [90.0, 80.0], 70.0),
        ("gr4cil", "cifar100", 1, [92.0, 84.0], 76.0),
        ("finetune", "cifar100", 0, [90.0, 40.0], 10.0),
        ("gr4cil", "imagenet_r", 0, [70.0, 60.0], 50.0),
    ]
    for label, dataset, seed, accs, first_task_after in rows:
        path = tmp_path / dataset / label / f"T10-seed{seed}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_result(label, dataset, seed, accs, first_task_after)))
    return tmp_path


def test_cells_are_mean_and_population_std_over_seeds(results_dir):
    markdown = write_tables(results_dir)
    table, note = markdown.rstrip("\n").split("\n\n")
    lines = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in table.splitlines()[2:]
    }
    assert note == (
        "Avg, Last: accuracy (%); Forgetting (lower is better), BWT (backward transfer, negative when "
        "later tasks cost earlier ones): points of accuracy. Mean ± population std over seeds; "
        "n = 1 to 2 seeds a cell."
    )
    # gr4cil cifar100: Avg over seeds = mean(85, 88) = 86.5, std 1.5; Last = mean(80, 84) = 82, std 2;
    # forgetting: task 1 falls 90 -> 70 (20) and 92 -> 76 (16): 18 ± 2, and BWT minus that (one task
    # before the last, learned at stage 1: its best earlier accuracy is the one just after learning)
    assert lines["gr4cil"][:4] == ["86.50 ± 1.50", "82.00 ± 2.00", "18.00 ± 2.00", "-18.00 ± 2.00"]
    assert lines["gr4cil"][4:] == ["65.00 (n = 1)", "60.00 (n = 1)", "20.00 (n = 1)", "-20.00 (n = 1)"]
    assert lines["finetune"][:4] == ["65.00 (n = 1)", "40.00 (n = 1)", "80.00 (n = 1)", "-80.00 (n = 1)"]
    assert lines["finetune"][4:] == ["–"] * 4  # one seed: no "± 0.00"; no run: "–"
    for name in ("table.md", "table.csv", "table.tex"):
        assert (results_dir / name).stat().st_size > 0


def test_latex_is_booktabs_with_matching_columns(results_dir):
    write_tables(results_dir)
    tex = (results_dir / "table.tex").read_text()
    assert "\\toprule" in tex and "\\bottomrule" in tex and tex.count("{") == tex.count("}")
    body = tex.split("\\midrule")[1].split("\\bottomrule")[0].strip().splitlines()
    assert all(row.count("&") == 8 and row.endswith("\\\\") for row in body)
    assert "$\\pm$" in tex and "continual" not in tex


def test_one_task_runs_show_no_forgetting(tmp_path):
    result = _result("gr4cil", "cifar100", 0, [90.0, 80.0], 70.0, n_tasks=1)
    result["stages"] = result["stages"][:1]
    result["summary"] |= {"avg_acc": 90.0, "last_acc": 90.0}  # its one stage's, as the runner writes
    path = tmp_path / "cifar100" / "gr4cil" / "T1-seed0.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(result))
    row = write_tables(tmp_path).splitlines()[2]
    assert [c.strip() for c in row.split("|")[2:-1]] == ["90.00 (n = 1)", "90.00 (n = 1)", "–", "–"]


def test_cli_on_an_empty_folder_is_a_one_line_error(tmp_path, capsys):
    assert tables_main(["--results-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize(
    "dataset, backbone, said",
    [
        (
            "synthetic",
            {"model": "tiny-clip-32", "pretrained": "synthetic"},
            "the synthetic world with the tiny CLIP",
        ),
        ("cifar100", {"model": "ViT-B-16-quickgelu", "pretrained": None}, "a randomly initialised backbone"),
        ("cifar100", {"model": "ViT-B-16-quickgelu", "pretrained": "openai"}, None),
    ],
)
def test_a_table_of_offline_runs_says_in_one_line_that_it_ranks_nothing(tmp_path, dataset, backbone, said):
    for label, seed in (("gr4cil", 0), ("mine", 0), ("mine", 1)):
        result = _result(label, dataset, seed, [90.0, 80.0], 70.0)
        result["config"] = {"backbone": backbone}
        path = tmp_path / dataset / label / f"T10-seed{seed}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result))
    lines = [line for line in write_tables(tmp_path).splitlines() if line.startswith("**Not a ranking**")]
    if said is None:
        assert lines == []
    else:
        assert lines == [
            f"**Not a ranking**: 3 of 3 runs are on {said}: it shows that each method runs the protocol "
            "end to end; it cannot rank methods, which only the real data with pretrained weights can "
            "(python -m benchmarks.run --suite main)."
        ]
