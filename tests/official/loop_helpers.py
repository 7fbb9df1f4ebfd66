"""What the training-loop tests share (issue 52): a strategy trained by ``CLIPStrategy``'s own
Avalanche loop on a fixture's batches in the fixture's order, the record of each of its optimiser
steps (``tests/official/goldens/loop.py``), the comparison with the official record, the
perturbations the comparison must catch, and the comparison of a full-tensor record
(``tests/official/goldens/suite_loop.py``)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from avalanche.core import SupervisedPlugin

from benchmarks.data.streams import build_stream
from tests.official.goldens.loop import FINGERPRINT, StepRecord

# What each loop test changes in the suite's strategy; the comparison must fail under every one.
PERTURBATIONS = ("learning rate", "weight decay", "loss weight", "scheduler step")


class _Recorder(SupervisedPlugin):
    """After each optimiser step: the loss, each group's lr as the step used it (read before the
    step: the strategy steps its scheduler inside ``optimizer_step``) and the fingerprints."""

    def __init__(self) -> None:
        super().__init__()
        self.record: StepRecord | None = None
        self._lrs: list[float] = []

    def before_update(self, strategy, **kwargs):
        self._lrs = [g["lr"] for g in strategy.optimizer.param_groups]

    def after_update(self, strategy, **kwargs):
        self.record.step(float(strategy.loss.detach()), self._lrs)


def fixture_batches(tensors: dict[str, torch.Tensor], task: int) -> list[list[torch.Tensor]]:
    batches, s = [], 0
    while f"input.task{task}.x{s}" in tensors:
        x, y = tensors[f"input.task{task}.x{s}"], tensors[f"input.task{task}.y{s}"]
        batches.append([x, y, torch.zeros_like(y)])  # (image, class id, task label 0), as the streams
        s += 1
    return batches


def _stream(tensors, tasks):
    """An Avalanche stream of ``tasks`` whose training images are the fixture's batches (what a
    second stage reads under the eval transform: here the identity); the test split is unused."""
    images, targets = [], []
    for t in range(len(tasks)):
        for x, y, _ in fixture_batches(tensors, t):
            images += list(x)
            targets += y.tolist()
    n_classes = max(max(t) for t in tasks) + 1
    data = SimpleNamespace(
        name="loop",
        class_names=[f"class{c}" for c in range(n_classes)],
        train=list(zip(images, targets)),  # (image, label) items, as the suite's datasets give
        train_targets=targets,
        test=list(zip(images, targets)),
        test_targets=targets,
    )
    order = [c for t in tasks for c in t]
    identity = lambda x: x  # noqa: E731
    return build_stream(data, len(tasks), order, identity, identity)


@dataclasses.dataclass
class SuiteLoop:
    records: list[StepRecord]  # the steps of Avalanche's loop, a task each
    scores: list[torch.Tensor]
    stages: list[dict[str, StepRecord]] = dataclasses.field(default_factory=list)  # second stages


def run_suite_loop(
    strategy, tensors, tasks, trained, initial, setup=None, test_key: str = "input.test_x", batches_of=None
) -> SuiteLoop:
    """Train ``strategy`` on the fixture's batches, task by task, through Avalanche's ``train`` (the
    strategy's own optimiser, schedule, clipping, loss and second stages); ``trained()`` names the
    tensors to fingerprint against ``initial``; ``setup(task)``, if given, runs after the strategy's
    ``setup_task`` (to give a tensor drawn there the fixture's initial value). ``batches_of(task)``:
    the task's loader (default: the fixture's batches). After each task, its ``scores`` on the test
    images."""
    recorder = _Recorder()
    strategy.plugins.append(recorder)
    stream = _stream(tensors, tasks)
    if setup is not None:
        own = strategy.setup_task

        def setup_task(task, classes):
            own(task, classes)
            setup(task)

        strategy.setup_task = setup_task
    out = SuiteLoop([], [])
    for t, experience in enumerate(stream.train_stream):
        batches = batches_of(t) if batches_of is not None else fixture_batches(tensors, t)
        strategy.make_train_dataloader = lambda *a, _b=batches, **k: setattr(strategy, "dataloader", _b)
        recorder.record = StepRecord(trained, initial)
        strategy.train(experience)
        out.records.append(recorder.record)
        strategy.backbone.eval()
        with torch.no_grad():
            out.scores.append(strategy.scores(tensors[test_key]).float())
    return out


def loop_differences(loop: SuiteLoop, tensors, stage: str = "") -> dict[str, float]:
    """The largest |suite - official| of each compared quantity over every step and task: loss, lr
    (every group), each fingerprint entry (over every tensor) and the scores. A step or a tensor
    one side lacks is infinite. ``stage``: the prefix of the loop's
    steps in the fixture (``output.task{t}.{stage}step{s}``); ``loop.stages[t][name]`` are compared
    with ``output.task{t}.{name}.step{s}``."""
    diffs: dict[str, float] = {}

    def worst(key: str, value: float) -> None:
        diffs[key] = max(diffs.get(key, 0.0), value)

    compared = [(record, f"output.task{t}.{stage}") for t, record in enumerate(loop.records)]
    for t, stages in enumerate(loop.stages):
        compared += [(record, f"output.task{t}.{name}.") for name, record in stages.items()]
    for record, prefix in compared:
        ours = record.tensors(prefix)
        official = {k: v for k, v in tensors.items() if k.startswith(f"{prefix}step")}
        if ours.keys() != official.keys():
            worst("steps and tensors", float("inf"))
        for key in ours.keys() & official.keys():
            a, b = ours[key].double(), official[key].double()
            if a.shape != b.shape:
                worst("steps and tensors", float("inf"))
                continue
            kind = key.rsplit(".", 1)[-1] if ".fp." not in key else None
            if kind is not None:
                worst(kind, (a - b).abs().max().item())
            else:
                for i, entry in enumerate(FINGERPRINT):
                    worst("entry" if entry.startswith("entry") else entry, (a[i] - b[i]).abs().item())
    for t, scores in enumerate(loop.scores):
        worst("scores", (scores - tensors[f"output.task{t}.scores"]).abs().max().item())
    return diffs


def exceeded(diffs: dict[str, float], tolerances: dict[str, float]) -> dict[str, float]:
    """The quantities whose difference is above their tolerance."""
    return {k: v for k, v in diffs.items() if not v <= tolerances.get(k, 0.0)}


#: An unperturbed loop stays within this share of each tolerance, on every machine that runs the
#: tests, while each perturbation must exceed the tolerance itself: a tolerance with a measured
#: margin on both sides, never one a change of CPU kernels could cross unseen.
MARGIN = 0.5


def beyond_margin(diffs: dict[str, float], tolerances: dict[str, float]) -> dict[str, float]:
    """The quantities whose difference is above ``MARGIN`` of their tolerance (an unperturbed loop
    has none)."""
    return exceeded(diffs, {k: MARGIN * v for k, v in tolerances.items()})


def suite_run_fixture(suite_strategy, run):
    """A module fixture ``suite_run``: the unperturbed ``suite_strategy()`` and ``run(fixture,
    strategy)``, trained once for the module's tests."""

    @pytest.fixture(scope="module")
    def suite_run(fixture):
        strategy = suite_strategy()
        return strategy, run(fixture, strategy)

    return suite_run


def perturbation_test(
    suite_strategy,
    run,
    tolerances,
    lr,
    schedule,
    weight_decay,
    expected=lambda fixture: fixture[0],
    **compare,
):
    """The test that the comparison (``loop_differences`` with ``compare``, against ``expected(fixture)``:
    the fixture's tensors by default) fails under each of ``PERTURBATIONS`` of ``suite_strategy``:
    learning rate ``lr``, the scheduler stepping by ``schedule``, the decay value ``weight_decay``
    in the same parameter groups (a grouping changed as well would be caught by the group count
    alone), the loss weighted (``run(fixture, strategy, perturb_loss=True)``: ``weigh_the_loss``
    where its loop allows). It fails on a number, never on the steps' or tensors' names alone."""

    @pytest.mark.parametrize("perturbation", PERTURBATIONS)
    def test_the_comparison_fails_under_a_perturbation(fixture, perturbation):
        tensors = expected(fixture)
        changes = {
            "learning rate": {"lr": lr},
            "scheduler step": {"schedule": schedule},
            "weight decay": {"weight_decay": weight_decay},
        }
        strategy = suite_strategy(**changes.get(perturbation, {}))
        loop = run(fixture, strategy, perturb_loss=perturbation == "loss weight")
        found = exceeded(loop_differences(loop, tensors, **compare), tolerances)
        assert found and "steps and tensors" not in found, found

    return test_the_comparison_fails_under_a_perturbation


def weigh_the_loss(strategy) -> None:
    """The loss-weight perturbation: the strategy's CE weighted 1.1."""
    strategy.compute_loss = lambda output, targets: 1.1 * F.cross_entropy(output, targets)


def extra_scheduler_step(strategy) -> None:
    """The schedule one step ahead: the scheduler stepped once more when it is built."""
    make_optimizer = strategy.make_optimizer

    def ahead(**kwargs):
        make_optimizer(**kwargs)
        strategy.scheduler.step()

    strategy.make_optimizer = ahead


def record_differences(steps, scores, tensors, diffs: dict[str, float]) -> None:
    """Into ``diffs``: the largest |suite - official| of the loss, every group's lr (infinite where
    the groups differ) and every tensor over ``steps`` (``suite_loop.StepRecord``'s) against the
    fixture's ``output.step{n}.*``, and of ``scores`` against ``output.task{t}.scores``. The names
    of each step's tensors and the shape of each task's scores must be the official ones."""
    for n, step in enumerate(steps):
        key = f"output.step{n}"
        diffs["loss"] = max(diffs["loss"], abs(step["loss"].item() - tensors[f"{key}.loss"].item()))
        official_lr = tensors[f"{key}.lr"].double()
        if step["lr"].shape != official_lr.shape:
            diffs["lr"] = float("inf")
        else:
            diffs["lr"] = max(diffs["lr"], (step["lr"] - official_lr).abs().max().item())
        official = {k[len(key) + 1 :]: v for k, v in tensors.items() if k.startswith(f"{key}.")}
        official.pop("loss"), official.pop("lr")
        assert step["tensors"].keys() == official.keys(), (sorted(step["tensors"]), sorted(official))
        for name, value in step["tensors"].items():
            diffs["tensors"] = max(diffs["tensors"], (value - official[name]).abs().max().item())
    for t, ours in enumerate(scores):
        expected = tensors[f"output.task{t}.scores"]
        assert ours.shape == expected.shape, (ours.shape, expected.shape)
        diffs["scores"] = max(diffs["scores"], (ours - expected).abs().max().item())
