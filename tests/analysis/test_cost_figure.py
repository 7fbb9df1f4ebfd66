"""Fig. 6's data (``analysis.figures.cost_frame``): every method that ran, a zero-shot one with no
trainable parameter included, with the minutes it trained and evaluated."""

import numpy as np

from analysis import figures
from analysis.paper_inputs import ReportInputs
from benchmarks.runner.result_record import RunCost, RunResult, StageResult, config_hash


def _run(label: str, seed: int, cost: RunCost) -> RunResult:
    stages = [
        StageResult(
            task=t,
            acc=50.0,
            acc_per_task=[50.0] * t,
            n_test_per_task=[2] * t,
            routing_acc=None,
            auroc=None,
            fpr95=None,
            diagnostics={},
        )
        for t in range(1, 11)
    ]
    return RunResult(
        schema_version=5,
        strategy=label,
        label=label,
        dataset="cifar100",
        n_tasks=10,
        seed=seed,
        config={},
        config_hash=config_hash({}),
        class_order=list(range(20)),
        class_names=[str(c) for c in range(20)],
        tasks=[[2 * t, 2 * t + 1] for t in range(10)],
        stages=stages,
        summary={"avg_acc": 50.0, "last_acc": 50.0},
        env={},
        cost=cost,
    )


def test_every_method_is_in_the_cost_figure_with_its_minutes(tmp_path):
    runs = [
        _run("continual_clip", 0, RunCost(train_seconds=0.0, eval_seconds=30.0, trainable_params=0)),
        _run("gr4cil", 0, RunCost(train_seconds=600.0, eval_seconds=60.0, trainable_params=250_000)),
        _run("gr4cil", 1, RunCost(train_seconds=720.0, eval_seconds=90.0, trainable_params=250_000)),
    ]
    dataset, frame = figures.cost_frame(ReportInputs(runs, runs))
    assert dataset == "cifar100"
    by_label = frame.groupby("label")[["params", "train_minutes", "eval_minutes"]].mean()
    assert by_label.loc["Continual-CLIP"].tolist() == [0.0, 0.0, 0.5]
    assert np.allclose(by_label.loc["GR4CIL"].tolist(), [0.25, 11.0, 1.25])  # (10 + 12) / 2, (1 + 1.5) / 2
    paths = figures.fig6_cost(ReportInputs(runs, runs), tmp_path)
    assert sorted(p.name for p in paths) == ["fig6_cost.pdf", "fig6_cost.png"]
