"""Paired bootstrap intervals for accuracy over seeds and test images.

Pure functions, arrays in and arrays out. A run contributes, for each stage t and test image i,
a value ``v[t, i]`` (1/0 "correct", or for a paired difference ``correct_A - correct_B`` on the
same image) and whether the image counts at that stage (``counted[t, i]``: its class has been
seen). A run's stage score is ``100 * sum_i v[t, i] counted[t, i] / sum_i counted[t, i]``: the
stage accuracy, or the difference of two stage accuracies.

The bootstrap resamples both sources of variation in a replication of the experiment: seeds
(training randomness) and test images, each with replacement. Every seed is scored on the same
test split, so images are crossed with seeds, not nested in them: a replicate draws its seeds,
then one resample of the images that all its seeds share. (Resampling the images again within
each seed would treat one shared test set as n independent ones and shrink the image part of the
variance n-fold.) Scoring both strategies on the same image resample keeps the pairing.

Forgetting and backward transfer are functions of every task's accuracy at every stage, not of
the stage scores: ``task_accuracies`` recomputes that matrix from each resample of the images, and
``bootstrap_seed_means`` averages any per-seed score of a resample over the drawn seeds.

A suite that varies the class order too gives one run per (order, seed): the bootstrap then draws
those units as it draws seeds (each with its own ``counted``: its order's tasks), and
``order_variance`` says how much of their spread lies between the orders.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Callable

import numpy as np

CONFIDENCE = 0.95
POWER = 0.80  # of the smallest detectable difference
_CHUNK_ELEMENTS = 2**24  # bootstrap weights held at once (draws x images), about 128 MB as float64


def stage_scores(values: np.ndarray, counted: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """``100 * sum(w v counted) / sum(w counted)`` per stage: ``[T]``, or ``[D, T]`` for weights
    ``[D, N]`` (one row of image counts per bootstrap draw). A stage with nothing counted is NaN."""
    masked = np.where(counted, values, 0.0).astype(float)
    counted = counted.astype(float)
    if weights is None:
        weights = np.ones(values.shape[1])
    with np.errstate(invalid="ignore", divide="ignore"):
        return 100.0 * (weights @ masked.T) / (weights @ counted.T)


def _image_draws(n_images: int, n_draws: int, rng: np.random.Generator) -> np.ndarray:
    """``[n_draws, n_images]`` counts: how often each image appears in a resample of the images."""
    picks = rng.integers(0, n_images, size=(n_draws, n_images))
    offsets = (np.arange(n_draws)[:, None] * n_images + picks).ravel()
    return np.bincount(offsets, minlength=n_draws * n_images).reshape(n_draws, n_images).astype(float)


def task_accuracies(
    correct: np.ndarray, image_task: np.ndarray, weights: np.ndarray | None = None
) -> np.ndarray:
    """``[T, T]`` (or ``[D, T, T]`` for image weights ``[D, N]``): the accuracy (%) on the images of
    task j (column) after stage t (row), from ``correct [T, N]`` and each image's 0-based task
    ``image_task [N]``; NaN for tasks not yet learned (j > t), as ``task_accuracy_matrix``."""
    n_stages = correct.shape[0]
    per_task = [
        stage_scores(correct, np.broadcast_to(image_task == task, correct.shape), weights)
        for task in range(n_stages)
    ]
    matrix = np.stack(per_task, axis=-1)  # [..., stage, task]
    return np.where(np.tri(n_stages, dtype=bool), matrix, np.nan)


def bootstrap_seed_means(
    score: Callable[[int, np.ndarray], np.ndarray],
    n_seeds: int,
    n_images: int,
    draws: int = 2000,
    seed: int = 0,
    resample_images: bool = True,
) -> np.ndarray:
    """``[draws, ...]`` bootstrap replicates of the mean over seeds of a per-seed score.

    Args:
        score: ``score(s, weights)`` is seed ``s``'s score on each image resample of ``weights
            [D, n_images]`` (how often each image is drawn), an array ``[D, ...]``.
        n_seeds, n_images: what is resampled; a replicate draws its seeds, then one resample of
            the images that all its seeds share (the module's docstring says why).
        draws: bootstrap replicates.
        seed: of the resampling, so that an interval is the same on every call.
        resample_images: False resamples seeds only; ``score`` then gets weights ``[1, n_images]``
            of ones.
    """
    rng = np.random.default_rng(seed)
    seed_weights = np.zeros((draws, n_seeds))  # each replicate's drawn seeds, as weights summing to 1
    np.add.at(
        seed_weights,
        (np.repeat(np.arange(draws), n_seeds), rng.integers(0, n_seeds, draws * n_seeds)),
        1.0 / n_seeds,
    )
    out = None
    chunk = max(1, _CHUNK_ELEMENTS // n_images) if resample_images else draws
    for start in range(0, draws, chunk):
        rows = slice(start, min(draws, start + chunk))
        weights = (
            _image_draws(n_images, rows.stop - start, rng) if resample_images else np.ones((1, n_images))
        )
        per_seed = np.stack([score(s, weights) for s in range(n_seeds)], 1)  # [D or 1, S, ...]
        per_seed = np.broadcast_to(per_seed, (rows.stop - start, *per_seed.shape[1:]))
        if out is None:
            out = np.empty((draws, *per_seed.shape[2:]))
        out[rows] = np.einsum("ds,ds...->d...", seed_weights[rows], per_seed)
    if out is None:
        raise ValueError(f"draws is {draws}: at least 1 is needed")
    return out


def bootstrap_stage_means(
    values: np.ndarray, counted: np.ndarray, draws: int = 2000, seed: int = 0, resample_images: bool = True
) -> np.ndarray:
    """``[draws, T]`` bootstrap replicates of the mean over seeds of the stage scores.

    Args:
        values: ``[S, T, N]`` per seed, stage and test image (the same N images for every seed).
        counted: ``[S, T, N]`` or ``[T, N]`` booleans, whether an image counts at a stage.
        draws: bootstrap replicates.
        seed: of the resampling, so that an interval is the same on every call.
        resample_images: False resamples seeds only (for results stored without predictions:
            pass each run's stage scores as ``values [S, T, 1]`` with ``counted`` all true).
    """
    values = np.asarray(values, dtype=float)
    n_seeds, _, n_images = values.shape
    counted = np.broadcast_to(np.asarray(counted, dtype=bool), values.shape)
    return bootstrap_seed_means(
        lambda s, weights: stage_scores(values[s], counted[s], weights),
        n_seeds,
        n_images,
        draws,
        seed,
        resample_images,
    )


@dataclass(frozen=True)
class Interval:
    """A point estimate with its percentile interval and the bootstrap's standard error."""

    estimate: float
    low: float
    high: float
    standard_error: float

    @property
    def verdict(self) -> str:
        """ "better" when the interval lies above 0, "worse" below, else no detectable difference."""
        return self.verdict_for(lower_is_better=False)

    def verdict_for(self, lower_is_better: bool) -> str:
        """The verdict on a metric where a smaller value may be the better one (forgetting): then
        "better" when the interval lies below 0."""
        above, below = ("worse", "better") if lower_is_better else ("better", "worse")
        if self.low > 0:
            return above
        if self.high < 0:
            return below
        return f"no detectable difference at {CONFIDENCE:.0%}".replace("%", " %")

    @property
    def detectable(self) -> float:
        """The smallest true difference that this design detects with ``POWER`` at ``CONFIDENCE``
        (two-sided): ``(z_(1 - alpha/2) + z_power) * standard_error``."""
        normal = NormalDist()
        return (normal.inv_cdf(0.5 + CONFIDENCE / 2) + normal.inv_cdf(POWER)) * self.standard_error


def interval(estimate: float, replicates: np.ndarray) -> Interval:
    """The percentile interval at ``CONFIDENCE`` of 1-d ``replicates`` around ``estimate``. A NaN
    replicate (a resample that drew no image of some task, whose accuracy is then undefined) is
    left out."""
    alpha = 1 - CONFIDENCE
    defined = np.asarray(replicates)[~np.isnan(replicates)]
    low, high = np.quantile(defined, [alpha / 2, 1 - alpha / 2])
    return Interval(float(estimate), float(low), float(high), float(np.std(defined, ddof=1)))


@dataclass(frozen=True)
class OrderSplit:
    """How the paired differences of several class orders spread: between the orders' means and
    between the seeds within an order (one-way analysis of variance, the orders as groups; each
    variance component by the method of moments, negative estimates set to 0)."""

    n_orders: int
    n_units: int
    between_sum_of_squares: float  # sum over orders of n_o (order mean - grand mean)^2
    within_sum_of_squares: float  # sum over units of (value - its order's mean)^2
    order_variance: float  # the variance of the orders' true means; NaN without seeds to compare
    seed_variance: float  # the variance of seeds within an order (the within mean square)
    f_statistic: float  # between / within mean square; NaN where undefined
    p_value: float  # of F: no difference between the orders' means

    @property
    def order_share(self) -> float:
        """The share of the variance that lies between orders: ``order / (order + seed)``."""
        total = self.order_variance + self.seed_variance
        return self.order_variance / total if total > 0 else math.nan


def order_variance(groups: list[list[float]]) -> OrderSplit:
    """Split the variance of values grouped by class order (``groups``: one list per order, of its
    seeds' values) between the orders and the seeds within them. With one seed per order the two
    cannot be told apart: the seed variance, F and p are NaN."""
    from scipy.stats import f as f_distribution

    arrays = [np.asarray(g, dtype=float) for g in groups]
    k, n = len(arrays), sum(len(g) for g in arrays)
    grand = np.concatenate(arrays).mean()
    between = float(sum(len(g) * (g.mean() - grand) ** 2 for g in arrays))
    within = float(sum(((g - g.mean()) ** 2).sum() for g in arrays))
    if k < 2 or n <= k:
        return OrderSplit(k, n, between, within, math.nan, math.nan, math.nan, math.nan)
    ms_between, ms_within = between / (k - 1), within / (n - k)
    n0 = (n - sum(len(g) ** 2 for g in arrays) / n) / (k - 1)  # the mean group size, unbalanced
    if ms_within > 0:
        f_statistic = ms_between / ms_within
        p_value = float(f_distribution.sf(f_statistic, k - 1, n - k))
    else:
        f_statistic, p_value = (math.inf, 0.0) if ms_between > 0 else (math.nan, math.nan)
    order = max(0.0, (ms_between - ms_within) / n0)
    return OrderSplit(k, n, between, within, order, ms_within, f_statistic, p_value)


def metric_of_stages(stage_values: np.ndarray, metric: str) -> np.ndarray:
    """Last (the final stage) or Avg (the mean over stages) of ``[..., T]`` stage scores."""
    if metric == "last":
        return stage_values[..., -1]
    if metric == "avg":
        return stage_values.mean(axis=-1)
    raise ValueError(f"metric must be 'last' or 'avg', not {metric!r}")
