"""Pairing runs against a baseline, and the statistics of their differences (``analysis.compare``).

Runs are paired by dataset, task count and unit, after a check that they share their protocol
(``protocol``: what a comparison must hold fixed). A unit is a (class order, seed): a suite may vary
the class order beside the seed (``benchmarks.runner.suites``), and two runs pair only in the same
order and seed. Each pair's difference gets a 95 % interval from a bootstrap over units and test
images (``analysis.statistics``), both strategies scored on the same resampled images; where
predictions are missing, over units only. Where several orders were run, each order's difference
gets its own interval over its seeds, and ``order_variance`` splits the differences' variance
between the orders and the seeds within them (``OrderSplit``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from analysis.orders import OrderRow, Unit
from analysis.paired_runs import Run, check_protocols, load_runs
from analysis.statistics import (
    CONFIDENCE,
    POWER,
    Interval,
    OrderSplit,
    bootstrap_seed_means,
    bootstrap_stage_means,
    interval,
    metric_of_stages,
    order_variance,
    task_accuracies,
)
from benchmarks.core.errors import UserError
from benchmarks.core.metrics import average_forgetting, backward_transfer
from benchmarks.runner.reading import (
    CANNOT_RANK,
    cannot_rank,
    counted,
    not_a_measurement,
    skipped_clause,
)
from benchmarks.runner.result_record import RunResult

METRICS = {
    "last": ("last_acc", "Last accuracy"),
    "avg": ("avg_acc", "Avg accuracy"),
    "forgetting": ("forgetting", "Forgetting"),
    "bwt": ("bwt", "Backward transfer, BWT"),
}
#: the metrics computed from every task's accuracy at every stage, not from the stage accuracies
TASK_METRICS = {"forgetting": average_forgetting, "bwt": backward_transfer}
LOWER_IS_BETTER = frozenset({"forgetting"})  # a strategy that forgets less is the better one
DRAWS = 2000
#: fewer bootstrap replicates than this give no usable 95 % interval
MIN_DRAWS = 100
METHOD = (
    "paired bootstrap over seeds and test images (both strategies on the same resampled images), "
    f"{CONFIDENCE:.0%} percentile interval; detectable: {POWER:.0%} power at {CONFIDENCE:.0%}"
).replace("%", " %")


def counted_images(result: RunResult, targets: np.ndarray) -> np.ndarray:
    """``[T, N]``: whether each test image's class has been seen at each stage."""
    seen: set[int] = set()
    rows = []
    for classes in result.tasks[: len(result.stages)]:
        seen |= set(classes)
        rows.append(np.isin(targets, sorted(seen)))
    return np.array(rows)


@dataclass
class Comparison:
    """One strategy against the baseline on one dataset and task count."""

    dataset: str
    n_tasks: int
    label: str
    baseline: str
    metric: str
    values: dict[Unit, float]  # the strategy's metric per (class order, seed)
    baseline_values: dict[Unit, float]
    paired_units: list[Unit]
    estimate: float | None = None  # mean over the paired units of (strategy - baseline)
    difference: Interval | None = None  # the estimate with its interval, where one can be had
    stage_bands: dict[str, np.ndarray] = field(default_factory=dict)  # label -> [3, T] mean, low, high
    notes: list[str] = field(default_factory=list)
    order_names: dict[str, str] = field(default_factory=dict)  # Unit.order -> the order's name
    by_order: list[OrderRow] = field(default_factory=list)  # where the paired units span several orders
    order_split: OrderSplit | None = None  # the paired differences' variance: orders against seeds
    #: why the runs cannot rank the two (``benchmarks.runner.reading.cannot_rank``); None: real runs
    cannot_rank: str | None = None

    @property
    def several_orders(self) -> bool:
        """Whether the runs span more than one class order (then n is orders x seeds)."""
        return len({unit.order for unit in [*self.values, *self.baseline_values]}) > 1

    def order_name(self, unit: Unit) -> str:
        return self.order_names.get(unit.order, unit.order)

    @property
    def verdict(self) -> str:
        if not self.paired_units:
            return "unpaired"
        if self.difference is None:
            return "no interval"
        verdict = self.difference.verdict_for(self.metric in LOWER_IS_BETTER)
        if self.cannot_rank and verdict in ("better", "worse"):  # a difference, not a ranking
            return f"{verdict} on {self.cannot_rank} only: not a ranking"
        return verdict


def _values(runs: dict[Unit, Run], metric: str) -> dict[Unit, float]:
    key = METRICS[metric][0]
    return {unit: run.result.summary[key] for unit, run in sorted(runs.items())}


def _same_test_set(runs: list[Run]) -> bool:
    """Whether every run scored the same images in the same places: what crossing the image
    resample with the units needs (in each class order alike)."""
    _, targets, image_ids = runs[0].predicted()
    return all(
        np.array_equal(run.predicted()[2], image_ids) and np.array_equal(run.predicted()[1], targets)
        for run in runs
    )


def _stage_band(runs: list[Run], draws: int) -> np.ndarray:
    """``[3, T]``: mean over units of the stage accuracy and its 95 % interval (units and images);
    each run counts the images of the classes its own order has shown."""
    mean = np.mean([run.stage_accuracy for run in runs], axis=0)
    if all(run.correct is not None for run in runs) and _same_test_set(runs):
        values = np.stack([run.predicted()[0] for run in runs]).astype(float)
        counted = np.stack([counted_images(run.result, run.predicted()[1]) for run in runs])
        replicates = bootstrap_stage_means(values, counted, draws)
    else:
        replicates = bootstrap_stage_means(
            np.stack([run.stage_accuracy for run in runs])[:, :, None] / 100.0,
            np.ones((len(mean), 1), bool),
            draws,
            resample_images=False,
        )
    alpha = 1 - CONFIDENCE
    return np.vstack([mean, *np.quantile(replicates, [alpha / 2, 1 - alpha / 2], axis=0)])


def image_tasks(result: RunResult, targets: np.ndarray) -> np.ndarray:
    """``[N]``: the 0-based task of each test image's class (-1 for a class in no task)."""
    tasks = np.full(len(targets), -1)
    for task, classes in enumerate(result.tasks):
        tasks[np.isin(targets, classes)] = task
    return tasks


def _paired_image_replicates(pairs: list[tuple[Run, Run]], metric: str, draws: int) -> np.ndarray:
    """``[draws]`` replicates of the mean paired difference of ``metric``, over units and test
    images, both strategies scored on the same resampled images (each pair's tasks: its order's)."""
    correct = [(a.predicted()[0].astype(float), b.predicted()[0].astype(float)) for a, b in pairs]
    targets = [a.predicted()[1] for a, _ in pairs]
    if metric not in TASK_METRICS:
        values = np.stack([a - b for a, b in correct])
        counted = np.stack([counted_images(a.result, t) for (a, _), t in zip(pairs, targets, strict=True)])
        stage_means = bootstrap_stage_means(values, counted, draws)
        return metric_of_stages(stage_means, metric)
    of_matrix = TASK_METRICS[metric]
    tasks = [image_tasks(a.result, t) for (a, _), t in zip(pairs, targets, strict=True)]

    def difference(unit: int, weights: np.ndarray) -> np.ndarray:
        a, b = correct[unit]
        return of_matrix(task_accuracies(a, tasks[unit], weights)) - of_matrix(
            task_accuracies(b, tasks[unit], weights)
        )

    return bootstrap_seed_means(difference, len(pairs), len(targets[0]), draws)


def _paired_seed_replicates(pairs: list[tuple[Run, Run]], metric: str, draws: int) -> np.ndarray:
    """``[draws]`` replicates of the mean paired difference of ``metric``, over seeds only."""
    if metric not in TASK_METRICS:
        stage_differences = (
            np.stack([a.stage_accuracy - b.stage_accuracy for a, b in pairs])[:, :, None] / 100.0
        )
        stage_means = bootstrap_stage_means(
            stage_differences, np.ones((stage_differences.shape[1], 1), bool), draws, resample_images=False
        )
        return metric_of_stages(stage_means, metric)
    key = METRICS[metric][0]
    differences = [a.result.summary[key] - b.result.summary[key] for a, b in pairs]
    return bootstrap_seed_means(
        lambda seed, weights: np.full(len(weights), differences[seed]),
        len(pairs),
        1,
        draws,
        resample_images=False,
    )


def _difference_interval(
    estimate: float,
    pairs: list[tuple[Run, Run]],
    metric: str,
    draws: int,
    across_protocols: bool,
    notes: list[str],
    units: str = "seeds",
) -> Interval | None:
    """The paired difference's interval: over ``units`` (the pairs) and test images where every
    run stored predictions of one test set, else over ``units`` alone; None for one pair without
    predictions. What was resampled, where not both, goes to ``notes``."""
    one = units.removesuffix("s") if units == "seeds" else "unit"
    with_images = all(a.correct is not None and b.correct is not None for a, b in pairs)
    same_images = with_images and _same_test_set([run for pair in pairs for run in pair])
    if across_protocols:
        notes.append(f"across protocols: {units} resampled, test images not")
    if not across_protocols and same_images:
        replicates = _paired_image_replicates(pairs, metric, draws)
        if len(pairs) == 1:
            notes.append(f"one paired {one}: the interval covers the test images, not the {units}")
    elif len(pairs) > 1:
        replicates = _paired_seed_replicates(pairs, metric, draws)
        if not across_protocols:
            why = (
                "the class orders scored other test images (a run's limits)"
                if with_images
                else "some runs have no predictions (schema version 1, or a sidecar missing)"
            )
            notes.append(f"{units} resampled, test images not: {why}")
    else:
        notes.append(f"no interval: one paired {one} and no stored predictions")
        return None
    return interval(estimate, replicates)


def compare_pair(
    dataset: str,
    n_tasks: int,
    label: str,
    baseline: str,
    runs: dict[Unit, Run],
    baseline_runs: dict[Unit, Run],
    metric: str,
    draws: int = DRAWS,
    baseline_band: np.ndarray | None = None,
    across_protocols: bool = False,
) -> Comparison:
    """Compare ``label`` with ``baseline`` on one dataset and task count (``runs``: unit -> Run).
    ``baseline_band``: the baseline's ``_stage_band``, where the caller already has it.

    Raises ``ProtocolMismatch`` when any two of the runs differ in protocol (in class order and
    test set: two of one order). ``across_protocols`` lets their evaluation protocols differ
    (``ACROSS_PROTOCOLS``); the test images then need not be the same, so only the units are
    resampled. Where the paired units span several class orders, each order also gets its own
    difference and interval (``Comparison.by_order``) and the differences' variance is split
    between orders and seeds (``Comparison.order_split``).
    """
    check_protocols(dataset, n_tasks, label, baseline, runs, baseline_runs, across_protocols)
    paired = sorted(set(runs) & set(baseline_runs))
    comparison = Comparison(
        dataset,
        n_tasks,
        label,
        baseline,
        metric,
        _values(runs, metric),
        _values(baseline_runs, metric),
        paired,
        order_names={
            unit.order: str(run.result.config.get("class_order") or unit.order or "default")
            for group in (baseline_runs, runs)
            for unit, run in group.items()
        },
    )
    comparison.stage_bands[label] = _stage_band(list(runs.values()), draws)
    comparison.stage_bands[baseline] = (
        baseline_band if baseline_band is not None else _stage_band(list(baseline_runs.values()), draws)
    )
    if not paired:
        return comparison
    differences = {u: comparison.values[u] - comparison.baseline_values[u] for u in paired}
    comparison.estimate = float(np.mean(list(differences.values())))
    orders = list(dict.fromkeys(u.order for u in paired))
    units = "units (order, seed)" if len(orders) > 1 else "seeds"
    pairs = [(runs[u], baseline_runs[u]) for u in paired]
    comparison.difference = _difference_interval(
        comparison.estimate, pairs, metric, draws, across_protocols, comparison.notes, units
    )
    if len(orders) > 1:
        for order in orders:
            mine = [u for u in paired if u.order == order]
            estimate = float(np.mean([differences[u] for u in mine]))
            comparison.by_order.append(
                OrderRow(
                    comparison.order_names[order],
                    [u.seed for u in mine],
                    float(np.mean([comparison.values[u] for u in mine])),
                    float(np.mean([comparison.baseline_values[u] for u in mine])),
                    estimate,
                    _difference_interval(
                        estimate,
                        [(runs[u], baseline_runs[u]) for u in mine],
                        metric,
                        draws,
                        across_protocols,
                        [],
                    ),
                )
            )
        comparison.order_split = order_variance(
            [[differences[u] for u in paired if u.order == o] for o in orders]
        )
    return comparison


def _undefined(metric: str, groups: list[dict[Unit, Run]]) -> bool:
    """Whether some run lacks ``metric`` (None in its summary)."""
    key = METRICS[metric][0]
    return any(run.result.summary.get(key) is None for group in groups for run in group.values())


def compare_all(
    results_dir: str | Path,
    baseline: str = "gr4cil",
    strategies: list[str] | None = None,
    metric: str = "last",
    draws: int = DRAWS,
    problems: list[str] | None = None,
    runs: dict[tuple[str, int, str], dict[Unit, Run]] | None = None,
    across_protocols: bool = False,
) -> list[Comparison]:
    """Every (dataset, task count, strategy) against ``baseline``, where both have runs.
    ``runs``: what ``load_runs`` gave for ``results_dir``, to read the results only once."""
    if metric not in METRICS:
        raise UserError(f"--metric {metric!r} is not one of {', '.join(METRICS)}")
    problems = [] if problems is None else problems
    runs = load_runs(results_dir, problems) if runs is None else runs
    if not runs:
        raise UserError(
            f"no result JSON found under {results_dir}{skipped_clause(problems)}; run python -m "
            "benchmarks.run first or point --results-dir at a folder of results"
        )
    caveats = [
        why for seeds in runs.values() for run in seeds.values() if (why := not_a_measurement(run.result))
    ]
    for why in sorted(set(caveats)):
        problems.append(
            f"{caveats.count(why)} run(s) are {why}: a check of the code path, not a measurement; "
            "never report these intervals"
        )
    results = [run.result for seeds in runs.values() for run in seeds.values()]
    problems += [
        f"{count} run(s) are on {why}: {CANNOT_RANK}" for why, count in counted(map(cannot_rank, results))
    ]
    labels = sorted({label for _, _, label in runs})
    for name in [baseline, *(strategies or [])]:
        if name not in labels:
            raise UserError(f"no runs of {name!r} under {results_dir}; it holds {', '.join(labels)}")
    wanted = strategies or [label for label in labels if label != baseline]
    if not [label for label in wanted if label != baseline]:  # nothing to set against the baseline
        raise UserError(
            f"--strategies names only the baseline {baseline!r}; name other labels ({', '.join(labels)})"
            if strategies
            else f"only the baseline {baseline!r} has runs under {results_dir}: nothing to compare it with; "
            "run another strategy there, or pick another --baseline"
        )
    comparisons: list[Comparison] = []
    baseline_bands: dict[tuple[str, int], np.ndarray] = {}
    for (dataset, n_tasks, label), group in sorted(runs.items()):
        if label in wanted and label != baseline and (dataset, n_tasks, baseline) in runs:
            if metric in TASK_METRICS and _undefined(metric, [group, runs[(dataset, n_tasks, baseline)]]):
                problems.append(
                    f"{label} on {dataset} / {n_tasks} tasks: {METRICS[metric][1]} is undefined (one "
                    "task, or results without per-task accuracies); left out"
                )
                continue
            baseline_runs = runs[(dataset, n_tasks, baseline)]
            comparisons.append(
                compare_pair(
                    dataset,
                    n_tasks,
                    label,
                    baseline,
                    group,
                    baseline_runs,
                    metric,
                    draws,
                    baseline_bands.get((dataset, n_tasks)),
                    across_protocols,
                )
            )
            baseline_bands[(dataset, n_tasks)] = comparisons[-1].stage_bands[baseline]
            if note := tuning_note(label, group, baseline, baseline_runs):
                comparisons[-1].notes.append(note)
            offline = {
                why for run in [*group.values(), *baseline_runs.values()] if (why := cannot_rank(run.result))
            }
            comparisons[-1].cannot_rank = " and ".join(sorted(offline)) or None
    if not comparisons:
        raise UserError(
            f"{', '.join(wanted)} and {baseline} share no dataset and task count under {results_dir}"
        )
    return comparisons


def tuned_study(runs: dict[Unit, Run]) -> str | None:
    """The study a label's options came from (``config.tuned``, written by ``benchmarks.tune``), or None."""
    tuned = [run.result.config.get("tuned") for run in runs.values()]
    return next((t.get("study", "a tune") for t in tuned if t), None)


def tuning_note(
    label: str, runs: dict[Unit, Run], baseline: str, baseline_runs: dict[Unit, Run]
) -> str | None:
    """What a comparison must say when one side's options were tuned and the other's were not."""
    ours, theirs = tuned_study(runs), tuned_study(baseline_runs)
    if (ours is None) == (theirs is None):
        return None
    tuned, untuned, study = (label, baseline, ours) if ours else (baseline, label, theirs)
    return (
        f"{tuned} is a tuned row (its options chosen on a validation split by benchmarks.tune, study "
        f"{study}) and {untuned} is not: the difference includes what that tuning bought, which "
        f"{untuned} was not given"
    )


def unpaired_refusal(comparisons: list[Comparison]) -> str | None:
    """The one-line refusal for the first comparison whose runs share no (class order and) seed,
    or None."""
    for c in comparisons:
        if not c.paired_units:
            what, flags = (
                ("order and seed", "--class-order and --seeds") if c.several_orders else ("seed", "--seeds")
            )
            return (
                f"{c.label} and {c.baseline} share no {what} on {c.dataset} / {c.n_tasks} tasks "
                f"({c.label}: {', '.join(map(str, c.values))}; {c.baseline}: "
                f"{', '.join(map(str, c.baseline_values))}); a paired comparison needs the same {what}s: "
                f"run both with {flags}"
            )
    return None


def check_draws(draws: int) -> None:
    """Refuse a bootstrap too small for a 95 % interval (0 or fewer replicates included)."""
    if draws < MIN_DRAWS:
        raise UserError(f"--draws {draws} is too few for a 95 % interval; use at least {MIN_DRAWS}")
