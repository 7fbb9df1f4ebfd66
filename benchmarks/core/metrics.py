"""Metrics of the shared protocol (docs/decisions.md P1), computed from score matrices.

Every strategy exposes scores over all seen classes; the runner turns them into numbers here, the
same way for every strategy. All functions are pure: arrays in, numbers out.
"""

from __future__ import annotations

import numpy as np
from sklearn.metrics import roc_auc_score, roc_curve


def softmax(scores: np.ndarray) -> np.ndarray:
    """Row-wise softmax at temperature 1 (the AUROC score of docs/decisions.md P1)."""
    shifted = scores - scores.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)


def accuracy(pred: np.ndarray, target: np.ndarray) -> float:
    """Top-1 micro accuracy in percent (every test sample counts once)."""
    if len(target) == 0:
        return float("nan")
    return float(100.0 * np.mean(pred == target))


def accuracy_per_task(
    pred: np.ndarray, target: np.ndarray, task_of_class: dict[int, int], n_tasks_seen: int
) -> tuple[list[float], list[int]]:
    """Accuracy on the test images of each learned task, and how many images each task has."""
    sample_task = np.array([task_of_class[int(c)] for c in target])
    accs, counts = [], []
    for task in range(n_tasks_seen):
        mask = sample_task == task
        accs.append(accuracy(pred[mask], target[mask]))
        counts.append(int(mask.sum()))
    return accs, counts


def routing_accuracy(pred: np.ndarray, target: np.ndarray, task_of_class: dict[int, int]) -> float:
    """Percent of samples whose predicted class belongs to the ground-truth task:
    1[task(argmax q) == task(y)]."""
    pred_task = np.array([task_of_class[int(c)] for c in pred])
    true_task = np.array([task_of_class[int(c)] for c in target])
    return accuracy(pred_task, true_task)


def ood_metrics(id_scores: np.ndarray, ood_scores: np.ndarray) -> tuple[float, float]:
    """AUROC and FPR at 95% TPR, both in percent, with in-distribution as the positive class.

    ``id_scores`` and ``ood_scores`` are the max-softmax confidences of ID and OOD samples.
    """
    labels = np.concatenate([np.ones(len(id_scores)), np.zeros(len(ood_scores))])
    scores = np.concatenate([id_scores, ood_scores])
    auroc = roc_auc_score(labels, scores)
    fpr, tpr, _ = roc_curve(labels, scores)
    fpr95 = fpr[np.searchsorted(tpr, 0.95, side="left")]
    return float(100.0 * auroc), float(100.0 * fpr95)


def predicted_classes(scores: np.ndarray, seen_classes: list[int]) -> np.ndarray:
    """The class id of each row's highest score (``scores`` columns in the order of ``seen_classes``)."""
    return np.asarray(seen_classes)[scores.argmax(axis=1)]


def stage_metrics(
    scores: np.ndarray,
    seen_classes: list[int],
    targets: np.ndarray,
    task_of_class: dict[int, int],
    n_tasks_seen: int,
) -> dict:
    """All per-stage metrics of docs/decisions.md P1.

    Args:
        scores: ``[N, len(seen_classes)]`` scores q of every test sample (seen and future classes)
            over the seen classes, columns in the order of ``seen_classes``.
        seen_classes: class ids of the columns.
        targets: ``[N]`` true class ids.
        task_of_class: task index (0-based) of every class id of the stream.
        n_tasks_seen: number of tasks learned so far.
    """
    seen = set(seen_classes)
    is_id = np.array([int(c) in seen for c in targets])
    pred = predicted_classes(scores, seen_classes)
    pred_id, target_id = pred[is_id], targets[is_id]
    acc_per_task, n_test_per_task = accuracy_per_task(pred_id, target_id, task_of_class, n_tasks_seen)
    stage = {
        "acc": accuracy(pred_id, target_id),
        "acc_per_task": acc_per_task,
        "n_test_per_task": n_test_per_task,
        "routing_acc": routing_accuracy(pred_id, target_id, task_of_class),
        "auroc": None,
        "fpr95": None,
    }
    if (~is_id).any():
        confidence = softmax(scores).max(axis=1)
        stage["auroc"], stage["fpr95"] = ood_metrics(confidence[is_id], confidence[~is_id])
    return stage


def summarize(stages: list[dict]) -> dict:
    """Avg/Last accuracy (mean of A_1..A_T / A_T) and Avg/Last AUROC (stages 1..T-1 / stage T-1)."""
    accs = [s["acc"] for s in stages]
    aurocs = [s["auroc"] for s in stages if s["auroc"] is not None]
    return {
        "avg_acc": float(np.mean(accs)),
        "last_acc": float(accs[-1]),
        "avg_auroc": float(np.mean(aurocs)) if aurocs else None,
        "last_auroc": float(aurocs[-1]) if aurocs else None,
    }
