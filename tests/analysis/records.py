"""Typed result records made by hand for the analysis tests: the fields a test names, neutral
values for the rest."""

from benchmarks.runner.result_record import SCHEMA_VERSION, RunCost, RunResult, StageResult


def stage_result(task: int, acc: float, **fields) -> StageResult:
    """Stage ``task`` with accuracy ``acc``; ``fields`` set any other field."""
    values = {
        "acc_per_task": [],
        "n_test_per_task": [],
        "routing_acc": 100.0,
        "auroc": None,
        "fpr95": None,
        "diagnostics": {},
    }
    return StageResult(task=task, acc=acc, **{**values, **fields})


def run_result(
    label: str, dataset: str = "cifar100", n_tasks: int = 10, seed: int = 0, **fields
) -> RunResult:
    """A finished run of ``label`` (its strategy too, unless ``fields`` name one)."""
    values = {
        "schema_version": SCHEMA_VERSION,
        "strategy": label,
        "config": {},
        "class_order": [],
        "tasks": [],
        "stages": [],
        "summary": {},
        "env": {},
        "cost": RunCost(),
    }
    return RunResult(label=label, dataset=dataset, n_tasks=n_tasks, seed=seed, **{**values, **fields})
