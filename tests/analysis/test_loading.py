"""One results loader: every reader picks the same result where several files share a run's key."""

import numpy as np

from analysis import compare, tables
from analysis.paper_inputs import load_inputs
from benchmarks.runner.results import (
    Predictions,
    ResultStore,
    RunCost,
    RunKey,
    RunResult,
    StageResult,
    load_results,
)

KEY = RunKey("gr4cil", "cifar100", 2, 0)
TARGETS = np.array([0, 1, 2, 3])


def _stage(task: int, acc: float) -> StageResult:
    return StageResult(
        task=task,
        acc=acc,
        acc_per_task=[acc] * task,
        n_test_per_task=[2] * task,
        routing_acc=100.0,
        auroc=None,
        fpr95=None,
        diagnostics={},
    )


def _store(root, last_acc: float, zero_shot: dict | None) -> None:
    """A finished 2-task run of KEY whose last accuracy is ``last_acc``."""
    result = RunResult(
        schema_version=2,
        strategy=KEY.label,
        label=KEY.label,
        dataset=KEY.dataset,
        n_tasks=KEY.n_tasks,
        seed=KEY.seed,
        config={"suite_marker": last_acc},
        config_hash=f"hash{last_acc}",
        class_order=[0, 1, 2, 3],
        class_names=["a", "b", "c", "d"],
        tasks=[[0, 1], [2, 3]],
        stages=[_stage(1, 100.0), _stage(2, last_acc)],
        summary={"avg_acc": (100.0 + last_acc) / 2, "last_acc": last_acc},
        zero_shot=zero_shot,
        env={},
        cost=RunCost(),
    )
    predictions = np.stack([np.array([0, 1, 0, 0]), TARGETS])
    ResultStore(root).save(KEY, result, Predictions(predictions, TARGETS, np.arange(4)))


def _mixed_suites(tmp_path):
    """A main run and a zero-shot run of the same strategy, dataset and seed under one folder, as a
    user who copies both suites' results under ``runs/`` has."""
    runs = tmp_path / "runs"
    _store(runs / "zeroshot", 40.0, {"imagenet": {"zero_shot": 60.0, "n_test": 10}})
    _store(runs / "zeroshot-copy", 40.0, {"imagenet": {"zero_shot": 60.0, "n_test": 10}})  # identical
    _store(runs / "main", 80.0, None)
    return runs


def test_the_rule_prefers_the_run_without_zero_shot_and_counts_copies_once(tmp_path):
    loaded = load_results(_mixed_suites(tmp_path))
    assert len(loaded) == 3 and len(loaded.distinct) == 2
    (chosen,) = loaded.runs
    assert chosen.result["summary"]["last_acc"] == 80.0 and "main" in chosen.path.parts
    (note,) = loaded.notes
    assert note.startswith("2 results for gr4cil / cifar100 / 2 tasks / seed 0 with different configs; ")
    assert str(chosen.path) in note
    # without the main run, the zero-shot one is used, and its copy counts once
    alone = loaded.where(lambda stored: "zero_shot" in stored.result)
    assert [s.result["summary"]["last_acc"] for s in alone.runs] == [40.0] and alone.notes == []


def test_every_reader_counts_one_seed_in_the_mixed_suites_folder(tmp_path):
    runs = _mixed_suites(tmp_path)
    frame = tables.load_runs(runs, notes=[])
    assert len(frame) == 1 and frame["last_acc"].tolist() == [80.0]
    markdown = tables.write_tables(runs)
    assert "n = 1 seed in every cell" in markdown and "| 90.00 (n = 1) | 80.00 (n = 1) |" in markdown
    assert "Note: 2 results for gr4cil" in markdown

    problems: list[str] = []
    compared = compare.load_runs(runs, problems)
    assert list(compared) == [("cifar100", 2, "gr4cil")]
    assert [run.result["summary"]["last_acc"] for run in compared["cifar100", 2, "gr4cil"].values()] == [80.0]
    assert sum("2 results for gr4cil" in line for line in problems) == 1

    inputs = load_inputs(runs)
    assert [run["summary"]["last_acc"] for run in inputs.runs] == [80.0]
    assert len(inputs.all_runs) == 2  # the zero-shot table still finds the zero-shot run
