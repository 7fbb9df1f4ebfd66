"""The paired bootstrap of ``analysis.statistics``, against hand computations and simulations."""

import numpy as np
import pytest

from analysis.statistics import Interval, bootstrap_stage_means, interval, metric_of_stages, stage_scores


def test_stage_scores_by_hand():
    values = np.array([[1, 0, 1, 1], [0, 1, 1, 0]], float)
    counted = np.array([[1, 1, 0, 0], [1, 1, 1, 1]], bool)  # stage 1 sees images 0 and 1 only
    np.testing.assert_allclose(stage_scores(values, counted), [50.0, 50.0])
    weights = np.array([[2, 0, 1, 1], [0, 1, 0, 3]], float)  # image 0 twice, image 1 not, ...
    np.testing.assert_allclose(
        stage_scores(values, counted, weights), [[100.0, 100 * 1 / 4], [0.0, 100 * 1 / 4]]
    )


def test_identical_predictions_give_exactly_zero():
    rng = np.random.default_rng(0)
    correct = rng.random((3, 4, 50)) < 0.7
    difference = correct.astype(float) - correct
    replicates = bootstrap_stage_means(difference, np.ones((4, 50), bool), draws=500)
    result = interval(0.0, metric_of_stages(replicates, "last"))
    assert (result.low, result.high, result.standard_error) == (0.0, 0.0, 0.0)
    assert result.verdict == "no detectable difference at 95 %"


def test_one_seed_without_image_resampling_has_no_spread():
    stage_accuracy = np.array([[[0.8], [0.6]]])  # one seed, two stages, as stored without predictions
    replicates = bootstrap_stage_means(stage_accuracy, np.ones((2, 1), bool), draws=50, resample_images=False)
    np.testing.assert_allclose(replicates, [[80.0, 60.0]] * 50)
    assert metric_of_stages(replicates, "avg")[0] == pytest.approx(70.0)


def test_seed_only_resampling_spans_the_seed_means():
    per_seed = np.array([[[0.50]], [[0.60]], [[0.70]]])
    replicates = bootstrap_stage_means(per_seed, np.ones((1, 1), bool), draws=4000, resample_images=False)[
        :, 0
    ]
    assert replicates.min() == pytest.approx(50.0) and replicates.max() == pytest.approx(70.0)
    assert replicates.mean() == pytest.approx(60.0, abs=0.2)
    # the bootstrap variance of a mean of 3 resampled values is var_pop / 3
    assert replicates.var() == pytest.approx(np.var([50, 60, 70]) / 3, rel=0.08)


def test_verdicts_and_detectable_difference():
    assert Interval(2.0, 0.5, 3.5, 0.8).verdict == "better"
    assert Interval(-2.0, -3.5, -0.5, 0.8).verdict == "worse"
    assert Interval(0.4, -0.5, 1.2, 0.4).verdict == "no detectable difference at 95 %"
    assert Interval(0.0, -1, 1, 1.0).detectable == pytest.approx(1.959964 + 0.841621, abs=1e-5)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def test_the_interval_covers_a_known_difference_at_about_the_nominal_rate():
    """300 simulated comparisons, each: 300 test images shared by 3 seeds, with per-image
    systematic differences between the methods (B's logit = A's + N(0.3, 1.5)), seed effects and
    Bernoulli noise. The true difference is the population one (images and seeds drawn afresh)."""
    rng = np.random.default_rng(2024)
    n_seeds, n_images, seed_sd = 3, 300, 0.2

    def images(n):
        base = rng.normal(0.5, 1.5, n)
        return base, base + rng.normal(0.3, 1.5, n)

    a, b = images(2_000_000)
    shift = rng.normal(0, seed_sd, (2, 2_000_000))
    truth = 100 * np.mean(_sigmoid(b + shift[0]) - _sigmoid(a + shift[1]))
    counted = np.ones((1, n_images), bool)
    hits = 0
    for experiment in range(300):
        a, b = images(n_images)
        difference = []
        for _ in range(n_seeds):
            u, v = rng.normal(0, seed_sd, 2)
            difference.append(
                (rng.random(n_images) < _sigmoid(b + u)).astype(float)
                - (rng.random(n_images) < _sigmoid(a + v))
            )
        difference = np.array(difference)[:, None, :]
        estimate = stage_scores(difference.mean(axis=0), counted)[-1]
        replicates = bootstrap_stage_means(difference, counted, draws=600, seed=experiment)
        found = interval(estimate, metric_of_stages(replicates, "last"))
        hits += found.low <= truth <= found.high
    # nominal 95 % (measured: 0.947); crossing seeds with images errs, if anything, on the wide side
    assert 0.92 <= hits / 300 <= 0.995
