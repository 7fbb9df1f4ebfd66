"""Metrics against hand computations and metric identities."""

import numpy as np
import pytest

from benchmarks.core.metrics import (
    accuracy,
    average_forgetting,
    backward_transfer,
    ood_metrics,
    routing_accuracy,
    softmax,
    stage_metrics,
    summarize,
    task_accuracy_matrix,
)


def test_accuracy_is_micro_percent():
    assert accuracy(np.array([1, 2, 3, 4]), np.array([1, 2, 0, 0])) == 50.0


def test_softmax_rows_sum_to_one_and_match_hand_value():
    p = softmax(np.array([[0.0, np.log(3.0)], [5.0, 5.0]]))
    np.testing.assert_allclose(p, [[0.25, 0.75], [0.5, 0.5]])


def test_stage_metrics_by_hand():
    # Two tasks seen: task 0 = classes {0, 1}, task 1 = {2, 3}; class 4 is a future class (task 2).
    task_of_class = {0: 0, 1: 0, 2: 1, 3: 1, 4: 2}
    seen = [0, 1, 2, 3]
    targets = np.array([0, 1, 2, 3, 4])
    scores = np.array(
        [
            [0.9, 0.1, 0.0, 0.0],  # -> 0 correct
            [0.8, 0.2, 0.0, 0.0],  # -> 0 wrong, right task
            [0.0, 0.5, 0.4, 0.0],  # -> 1 wrong, wrong task
            [0.0, 0.0, 0.1, 0.7],  # -> 3 correct
            [0.2, 0.2, 0.2, 0.2],  # future sample, uniform: lowest confidence
        ]
    )
    stage = stage_metrics(scores, seen, targets, task_of_class, n_tasks_seen=2)
    assert stage["acc"] == 50.0
    assert stage["acc_per_task"] == [50.0, 50.0]
    assert stage["n_test_per_task"] == [2, 2]
    assert stage["routing_acc"] == 75.0
    # the OOD sample has the lowest max-softmax, so AUROC is perfect and FPR95 is 0
    assert stage["auroc"] == 100.0 and stage["fpr95"] == 0.0


def test_stage_metrics_column_order_follows_seen_classes():
    task_of_class = {5: 0, 7: 0}
    stage = stage_metrics(np.array([[0.0, 1.0]]), [7, 5], np.array([5]), task_of_class, 1)
    assert stage["acc"] == 100.0  # column 1 is class 5


def test_last_stage_has_no_auroc():
    stage = stage_metrics(np.eye(2), [0, 1], np.array([0, 1]), {0: 0, 1: 0}, 1)
    assert stage["auroc"] is None and stage["fpr95"] is None


def test_ood_metrics_hand_values():
    # ID {0.9, 0.4}, OOD {0.5, 0.1}: 3 of 4 (ID, OOD) pairs ordered correctly -> AUROC 75%
    auroc, fpr95 = ood_metrics(np.array([0.9, 0.4]), np.array([0.5, 0.1]))
    assert auroc == pytest.approx(75.0)
    # 95% TPR needs both ID samples accepted (threshold 0.4), which also accepts OOD 0.5 -> 50%
    assert fpr95 == pytest.approx(50.0)


def test_routing_accuracy_is_at_least_accuracy():
    rng = np.random.default_rng(0)
    task_of_class = {c: c // 5 for c in range(20)}
    pred, target = rng.integers(0, 20, 500), rng.integers(0, 20, 500)
    assert routing_accuracy(pred, target, task_of_class) >= accuracy(pred, target)


def test_summary_avg_includes_first_task_and_last_auroc_is_stage_t_minus_1():
    stages = [
        {"acc": 90.0, "auroc": 80.0, "acc_per_task": [90.0]},
        {"acc": 70.0, "auroc": 60.0, "acc_per_task": [60.0, 80.0]},
        {"acc": 50.0, "auroc": None, "acc_per_task": [40.0, 60.0, 50.0]},
    ]
    summary = summarize(stages)
    assert {k: summary[k] for k in ("avg_acc", "last_acc", "avg_auroc", "last_auroc")} == {
        "avg_acc": 70.0,
        "last_acc": 50.0,
        "avg_auroc": 70.0,
        "last_auroc": 60.0,
    }


# Per-task accuracies of a made-up 3-task run: task 1 first rises (60 -> 80), then falls to 70.
HAND_STAGES = [
    {"acc_per_task": [60.0]},
    {"acc_per_task": [80.0, 90.0]},
    {"acc_per_task": [70.0, 50.0, 85.0]},
]


def test_forgetting_and_bwt_equal_the_hand_computation():
    matrix = task_accuracy_matrix(HAND_STAGES)
    assert np.isnan(matrix[np.triu_indices(3, 1)]).all()  # tasks not yet learned
    # forgetting: task 1 best before the last stage max(60, 80) = 80, final 70 -> 10;
    # task 2: best 90, final 50 -> 40; mean (10 + 40) / 2 = 25 (task 3 is left out)
    assert average_forgetting(matrix) == pytest.approx(25.0)
    # BWT: task 1 final 70 minus just-learned 60 = +10; task 2: 50 - 90 = -40; mean -15. Not
    # minus the forgetting: task 1's best (80) came after it was learned.
    assert backward_transfer(matrix) == pytest.approx(-15.0)
    summary = summarize([{"acc": 50.0, "auroc": None, **stage} for stage in HAND_STAGES])
    assert (summary["forgetting"], summary["bwt"]) == (pytest.approx(25.0), pytest.approx(-15.0))


def test_forgetting_and_bwt_are_none_with_one_task_and_vectorise_over_draws():
    one = summarize([{"acc": 80.0, "auroc": None, "acc_per_task": [80.0]}])
    assert one["forgetting"] is None and one["bwt"] is None
    # leading axes (bootstrap draws) are kept: draw 0 the hand run, draw 1 a run that never forgets
    never_forgets = [[60.0], [60.0, 90.0], [60.0, 90.0, 85.0]]
    stable = task_accuracy_matrix([{"acc_per_task": accs} for accs in never_forgets])
    both = np.stack([task_accuracy_matrix(HAND_STAGES), stable])
    assert average_forgetting(both) == pytest.approx([25.0, 0.0])
    assert backward_transfer(both) == pytest.approx([-15.0, 0.0])
