"""The runs a comparison reads (``load_runs``: one ``Run`` per unit, with its per-image predictions
where it stored them) and what two runs must share to be paired (``protocol``, ``check_protocols``:
a ``ProtocolMismatch`` names the first field that differs)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analysis.orders import Unit
from benchmarks.core.errors import UserError
from benchmarks.data.splits import tasks_label
from benchmarks.runner.reading import Results, protocol_of, read_results
from benchmarks.runner.result_record import RunResult
from benchmarks.runner.results import RunKey


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

    def predicted(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``correct``, ``targets`` and ``image_ids``, where the caller has checked that it has them."""
        if self.correct is None or self.targets is None or self.image_ids is None:
            raise ValueError(f"{self.result.strategy}: this run stored no predictions")
        return self.correct, self.targets, self.image_ids


def protocol(run: Run) -> dict:
    """What must be equal for two runs to be compared, by the name a refusal gives it."""
    result, config = run.result, run.result.config
    backbone = dict(config.get("backbone", {}))
    weights = (
        backbone.pop("pretrained", None),
        backbone.pop("weights_sha256", None),
        backbone.pop("weights", None),
    )
    test_set = None
    if run.correct is not None:
        _, targets, image_ids = run.predicted()
        test_set = (image_ids.tolist(), targets.tolist())
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
        # a held-out split trains on fewer images; a tuning run's "test" numbers are validation ones
        "validation split": config.get("validation"),
        "test set read": config.get("evaluate_test", True),
        "test set": (test_set, [stage.n_test_per_task for stage in result.stages][-1:]),
    }


#: what ``--across-protocols`` lets differ: the fields a source's protocol sets
ACROSS_PROTOCOLS = ("evaluation protocol", "class order", "data", "test set")
#: what differs from one class order to another: checked within each order only
WITHIN_ORDER = ("class order", "test set")


def protocol_difference(
    pa: dict, b: Run, across_protocols: bool = False, skip: tuple[str, ...] = ()
) -> str | None:
    """The first field in which run ``b`` differs from protocol ``pa``, or None. A test set is
    compared image by image where both runs stored predictions, else by its counts per task.
    ``across_protocols``: the fields of ``ACROSS_PROTOCOLS`` may differ; ``skip``: these too."""
    pb = protocol(b)
    for name in pa:
        if (across_protocols and name in ACROSS_PROTOCOLS) or name in skip:
            continue
        left, right = pa[name], pb[name]
        if name == "test set" and (left[0] is None or right[0] is None):
            left, right = left[1], right[1]
        if left != right:
            return name
    return None


def check_protocols(
    dataset: str,
    n_tasks: int,
    label: str,
    baseline: str,
    runs: dict[Unit, Run],
    baseline_runs: dict[Unit, Run],
    across_protocols: bool,
) -> None:
    """Refuse (``ProtocolMismatch``) runs that differ in protocol: every field against the
    baseline's first run, the class order and test set against the first run of the same order."""
    first = next(iter(baseline_runs))
    reference = protocol(baseline_runs[first])
    in_order: dict[str, tuple[Unit, dict]] = {}  # each class order: its first run and protocol
    for group in (baseline_runs, runs):
        for unit, run in group.items():
            in_order.setdefault(unit.order, (unit, protocol(run)))
    for who, group in ((baseline, baseline_runs), (label, runs)):
        for unit, run in group.items():
            other, by_order = in_order[unit.order]
            for against, fields, skip in ((first, reference, WITHIN_ORDER), (other, by_order, ())):
                if (field_name := protocol_difference(fields, run, across_protocols, skip)) is not None:
                    hint = " (or pass --across-protocols)" if field_name in ACROSS_PROTOCOLS else ""
                    owner = baseline if fields is reference or against in baseline_runs else label
                    raise ProtocolMismatch(
                        f"{label} and {baseline} differ in {field_name} on {dataset} / {n_tasks} tasks "
                        f"({who}, seed {unit}, against {owner}, seed {against}); "
                        f"a comparison needs the same protocol: rerun one of them under the other's{hint}"
                    )


def load_runs(
    results_dir: str | Path | list[str | Path] | Results, problems: list[str]
) -> dict[tuple[str, int, str], dict[Unit, Run]]:
    """(dataset, n_tasks, label) -> ``Unit`` (class order, seed) -> Run, for every stored result
    under ``results_dir`` (a folder, a list of folders, or what ``read_results`` read): one result
    per run key, by ``Results``' rule, whose notes go to ``problems``."""
    results = read_results(results_dir)
    problems += results.notes
    runs: dict[tuple[str, int, str], dict[Unit, Run]] = defaultdict(dict)
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
        runs[paired_dataset(key), key.n_tasks, key.label][Unit(key.order, key.seed)] = run
    return runs


def paired_dataset(key: RunKey) -> str:
    """The dataset as comparisons group and name it: a half-base split is a stream of its own, never
    paired with as many equal tasks (``cifar100 (B50 Inc10)``)."""
    return f"{key.dataset} ({tasks_label(key.n_tasks, key.split)})" if key.split else key.dataset
