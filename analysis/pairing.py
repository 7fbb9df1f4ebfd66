"""Pairing runs against a baseline, and the statistics of their differences (``analysis.compare``).

Runs are paired by dataset, task count and seed, after a check that they share their protocol
(``protocol``: what a comparison must hold fixed). Each pair's difference gets a 95 % interval from
a bootstrap over seeds and test images (``analysis.statistics``), both strategies scored on the
same resampled images; where predictions are missing, over seeds only.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from analysis.statistics import (
    CONFIDENCE,
    POWER,
    Interval,
    bootstrap_seed_means,
    bootstrap_stage_means,
    interval,
    metric_of_stages,
    task_accuracies,
)
from benchmarks.core.errors import UserError
from benchmarks.core.metrics import average_forgetting, backward_transfer
from benchmarks.runner.reading import Results, not_a_measurement, protocol_of, read_results
from benchmarks.runner.results import RunResult

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


class ProtocolMismatch(UserError):
    """Two runs that differ in what a comparison must hold fixed."""


@dataclass
class Run:
    """One stored run, with its per-image predictions where it has them."""

    result: RunResult
    correct: np.ndarray | None = None  # [T, N] booleans
    targets: np.ndarray | None = None  # [N]
    image_ids: np.ndarray | None = None  # [N]

    @property
    def stage_accuracy(self) -> np.ndarray:
        return np.array([stage.acc for stage in self.result.stages])


def protocol(run: Run) -> dict:
    """What must be equal for two runs to be compared, by the name a refusal gives it."""
    result, config = run.result, run.result.config
    backbone = dict(config.get("backbone", {}))
    weights = (
        backbone.pop("pretrained", None),
        backbone.pop("weights_sha256", None),
        backbone.pop("weights", None),
    )
    test_set = (run.image_ids.tolist(), run.targets.tolist()) if run.targets is not None else None
    return {
        "evaluation protocol": protocol_of(result),  # benchmarks.data.protocols
        "class order": list(result.class_order),
        "data": (config.get("dataset"), config.get("dataset_options")),
        "backbone": backbone,
        "weights": weights,
        "task count": result.n_tasks,
        "precision": config.get("precision"),
        "fast dev run": config.get("fast_dev_run"),  # never compared with real runs
        "fake data": config.get("fake_data", False),
        "test set": (test_set, [stage.n_test_per_task for stage in result.stages][-1:]),
    }


#: what ``--across-protocols`` lets differ: the fields a source's protocol sets
ACROSS_PROTOCOLS = ("evaluation protocol", "class order", "data", "test set")


def protocol_difference(pa: dict, b: Run, across_protocols: bool = False) -> str | None:
    """The first field in which run ``b`` differs from protocol ``pa``, or None. A test set is
    compared image by image where both runs stored predictions, else by its counts per task.
    ``across_protocols``: the fields of ``ACROSS_PROTOCOLS`` may differ."""
    pb = protocol(b)
    for name in pa:
        if across_protocols and name in ACROSS_PROTOCOLS:
            continue
        left, right = pa[name], pb[name]
        if name == "test set" and (left[0] is None or right[0] is None):
            left, right = left[1], right[1]
        if left != right:
            return name
    return None


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
    values: dict[int, float]  # the strategy's metric per seed
    baseline_values: dict[int, float]
    paired_seeds: list[int]
    estimate: float | None = None  # mean over the paired seeds of (strategy - baseline)
    difference: Interval | None = None  # the estimate with its interval, where one can be had
    stage_bands: dict[str, np.ndarray] = field(default_factory=dict)  # label -> [3, T] mean, low, high
    notes: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        if not self.paired_seeds:
            return "unpaired"
        if self.difference is None:
            return "no interval"
        return self.difference.verdict_for(self.metric in LOWER_IS_BETTER)


def _values(runs: dict[int, Run], metric: str) -> dict[int, float]:
    key = METRICS[metric][0]
    return {seed: run.result.summary[key] for seed, run in sorted(runs.items())}


def _stage_band(runs: list[Run], draws: int) -> np.ndarray:
    """``[3, T]``: mean over seeds of the stage accuracy and its 95 % interval (seeds and images)."""
    mean = np.mean([run.stage_accuracy for run in runs], axis=0)
    if all(run.correct is not None for run in runs):
        values = np.stack([run.correct for run in runs]).astype(float)
        counted = counted_images(runs[0].result, runs[0].targets)
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
    """``[draws]`` replicates of the mean paired difference of ``metric``, over seeds and test
    images, both strategies scored on the same resampled images."""
    first = pairs[0][0]
    if metric not in TASK_METRICS:
        values = np.stack([a.correct.astype(float) - b.correct for a, b in pairs])
        stage_means = bootstrap_stage_means(values, counted_images(first.result, first.targets), draws)
        return metric_of_stages(stage_means, metric)
    of_matrix, tasks = TASK_METRICS[metric], image_tasks(first.result, first.targets)

    def difference(seed: int, weights: np.ndarray) -> np.ndarray:
        a, b = pairs[seed]
        return of_matrix(task_accuracies(a.correct.astype(float), tasks, weights)) - of_matrix(
            task_accuracies(b.correct.astype(float), tasks, weights)
        )

    return bootstrap_seed_means(difference, len(pairs), len(first.targets), draws)


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


def compare_pair(
    dataset: str,
    n_tasks: int,
    label: str,
    baseline: str,
    runs: dict[int, Run],
    baseline_runs: dict[int, Run],
    metric: str,
    draws: int = DRAWS,
    baseline_band: np.ndarray | None = None,
    across_protocols: bool = False,
) -> Comparison:
    """Compare ``label`` with ``baseline`` on one dataset and task count (``runs``: seed -> Run).
    ``baseline_band``: the baseline's ``_stage_band``, where the caller already has it.

    Raises ``ProtocolMismatch`` when any two of the runs differ in protocol. ``across_protocols``
    lets their evaluation protocols differ (``ACROSS_PROTOCOLS``); the test images then need not be
    the same, so only the seeds are resampled.
    """
    reference = protocol(next(iter(baseline_runs.values())))
    for who, group in ((baseline, baseline_runs), (label, runs)):
        for seed, run in group.items():
            if (field_name := protocol_difference(reference, run, across_protocols)) is not None:
                hint = " (or pass --across-protocols)" if field_name in ACROSS_PROTOCOLS else ""
                raise ProtocolMismatch(
                    f"{label} and {baseline} differ in {field_name} on {dataset} / {n_tasks} tasks "
                    f"({who}, seed {seed}, against {baseline}, seed {next(iter(baseline_runs))}); "
                    f"a comparison needs the same protocol: rerun one of them under the other's{hint}"
                )
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
    )
    comparison.stage_bands[label] = _stage_band(list(runs.values()), draws)
    comparison.stage_bands[baseline] = (
        baseline_band if baseline_band is not None else _stage_band(list(baseline_runs.values()), draws)
    )
    if not paired:
        return comparison
    estimate = float(np.mean([comparison.values[s] - comparison.baseline_values[s] for s in paired]))
    comparison.estimate = estimate
    pairs = [(runs[s], baseline_runs[s]) for s in paired]
    if across_protocols:
        comparison.notes.append("across protocols: seeds resampled, test images not")
    if not across_protocols and all(a.correct is not None and b.correct is not None for a, b in pairs):
        replicates = _paired_image_replicates(pairs, metric, draws)
        if len(paired) == 1:
            comparison.notes.append("one paired seed: the interval covers the test images, not the seeds")
    elif len(paired) > 1:
        replicates = _paired_seed_replicates(pairs, metric, draws)
        if not across_protocols:
            comparison.notes.append(
                "seeds resampled, test images not: some runs have no predictions "
                "(schema version 1, or a sidecar missing)"
            )
    else:
        comparison.notes.append("no interval: one paired seed and no stored predictions")
        return comparison
    comparison.difference = interval(estimate, replicates)
    return comparison


def load_runs(
    results_dir: str | Path | list[str | Path] | Results, problems: list[str]
) -> dict[tuple[str, int, str], dict[int, Run]]:
    """(dataset, n_tasks, label) -> seed -> Run, for every stored result under ``results_dir`` (a
    folder, a list of folders, or what ``read_results`` read): one result per run key, by
    ``Results``' rule, whose notes go to ``problems``."""
    results = read_results(results_dir)
    problems += results.notes
    runs: dict[tuple[str, int, str], dict[int, Run]] = defaultdict(dict)
    for file in results.runs:
        run = Run(file.result)
        predictions = file.load_predictions(problems)
        if predictions is not None:
            run.correct, run.targets, run.image_ids = (
                predictions.correct(),
                predictions.targets,
                predictions.image_ids,
            )
        key = file.key
        runs[key.dataset, key.n_tasks, key.label][key.seed] = run
    return runs


def _undefined(metric: str, groups: list[dict[int, Run]]) -> bool:
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
    runs: dict[tuple[str, int, str], dict[int, Run]] | None = None,
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
            f"no result JSON found under {results_dir}; run python -m benchmarks.run first "
            "or point --results-dir at a folder of results"
        )
    caveats = [
        why for seeds in runs.values() for run in seeds.values() if (why := not_a_measurement(run.result))
    ]
    for why in sorted(set(caveats)):
        problems.append(
            f"{caveats.count(why)} run(s) are {why}: a check of the code path, not a measurement; "
            "never report these intervals"
        )
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
    comparisons, baseline_bands = [], {}
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
    if not comparisons:
        raise UserError(
            f"{', '.join(wanted)} and {baseline} share no dataset and task count under {results_dir}"
        )
    return comparisons


def unpaired_refusal(comparisons: list[Comparison]) -> str | None:
    """The one-line refusal for the first comparison whose runs share no seed, or None."""
    for c in comparisons:
        if not c.paired_seeds:
            return (
                f"{c.label} and {c.baseline} share no seed on {c.dataset} / {c.n_tasks} tasks "
                f"({c.label}: {', '.join(map(str, c.values))}; {c.baseline}: "
                f"{', '.join(map(str, c.baseline_values))}); a paired comparison needs the same seeds: "
                f"run both with --seeds"
            )
    return None


def check_draws(draws: int) -> None:
    """Refuse a bootstrap too small for a 95 % interval (0 or fewer replicates included)."""
    if draws < MIN_DRAWS:
        raise UserError(f"--draws {draws} is too few for a 95 % interval; use at least {MIN_DRAWS}")
