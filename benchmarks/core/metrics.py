"""Metrics of the shared protocol (docs/decisions.md P1), computed from score matrices.

Every strategy exposes scores over all seen classes; the runner turns them into numbers here, the
same way for every strategy. All functions are pure: arrays in, numbers out.
"""

from __future__ import annotations

import numpy as np


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
    from sklearn.metrics import roc_auc_score, roc_curve  # 1-2 s to import: only where scored

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


def task_accuracy_matrix(stages: list[dict]) -> np.ndarray:
    """``[T, T]``: the accuracy (%) on task j (column) after stage t (row), from each stage's
    ``acc_per_task``; NaN for the tasks not yet learned (j > t)."""
    n_stages = len(stages)
    matrix = np.full((n_stages, n_stages), np.nan)
    for row, stage in enumerate(stages):
        values = stage["acc_per_task"][:n_stages]
        matrix[row, : len(values)] = values
    return matrix


def average_forgetting(acc_matrix: np.ndarray) -> np.ndarray:
    """Average forgetting (Chaudhry et al. 2018) of ``[..., T, T]`` accuracy matrices
    (``task_accuracy_matrix``; leading axes, such as bootstrap draws, are kept): over every task j
    but the last, its best accuracy at stages j..T-1 minus its accuracy at stage T, averaged.
    Lower is better. NaN when T = 1 (no task has been followed by another)."""
    if acc_matrix.shape[-1] < 2:
        return np.full(acc_matrix.shape[:-2], np.nan)
    # rows = stages before the last, columns = tasks but the last; NaN above the diagonal (not yet
    # learned) is skipped by nanmax, and the diagonal is always there
    best_before_last = np.nanmax(acc_matrix[..., :-1, :-1], axis=-2)
    return (best_before_last - acc_matrix[..., -1, :-1]).mean(axis=-1)


def backward_transfer(acc_matrix: np.ndarray) -> np.ndarray:
    """Backward transfer (Lopez-Paz and Ranzato 2017) of ``[..., T, T]`` accuracy matrices: over
    every task j but the last, its accuracy at stage T minus its accuracy at stage j (just after
    learning it), averaged. Negative when learning later tasks hurts earlier ones; NaN when T = 1."""
    if acc_matrix.shape[-1] < 2:
        return np.full(acc_matrix.shape[:-2], np.nan)
    just_learned = np.diagonal(acc_matrix, axis1=-2, axis2=-1)[..., :-1]
    return (acc_matrix[..., -1, :-1] - just_learned).mean(axis=-1)


def _number_or_none(value: np.ndarray) -> float | None:
    return None if np.isnan(value) else float(value)


def summarize(stages: list[dict]) -> dict:
    """Avg/Last accuracy (mean of A_1..A_T / A_T), Avg/Last AUROC (stages 1..T-1 / stage T-1), and
    average forgetting and backward transfer from the per-task accuracies (None when T = 1)."""
    accs = [s["acc"] for s in stages]
    aurocs = [s["auroc"] for s in stages if s["auroc"] is not None]
    acc_matrix = task_accuracy_matrix(stages)
    return {
        "avg_acc": float(np.mean(accs)),
        "last_acc": float(accs[-1]),
        "avg_auroc": float(np.mean(aurocs)) if aurocs else None,
        "last_auroc": float(aurocs[-1]) if aurocs else None,
        "forgetting": _number_or_none(average_forgetting(acc_matrix)),
        "bwt": _number_or_none(backward_transfer(acc_matrix)),
    }
