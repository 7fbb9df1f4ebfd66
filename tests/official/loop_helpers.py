"""What the training-loop tests share (issue 52): a strategy trained by ``CLIPStrategy``'s own
Avalanche loop on a fixture's batches in the fixture's order, the record of each of its optimiser
steps (``benchmarks/tools/official_goldens/loop.py``), and the comparison with the official record."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import torch
from avalanche.core import SupervisedPlugin

from benchmarks.data.streams import build_stream
from benchmarks.tools.official_goldens.loop import FINGERPRINT, StepRecord


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


def loop_differences(
    loop: SuiteLoop, tensors, noise: tuple[str, ...] = (), stage: str = ""
) -> dict[str, float]:
    """The largest |suite - official| of each compared quantity over every step and task: loss, lr
    (every group), each fingerprint entry (over every tensor) and the scores. A step or a tensor
    one side lacks is infinite. Tensors whose name contains one of ``noise`` (a gradient that is zero
    but for rounding, which Adam scales up to lr-sized steps on both sides) are reported apart, under
    "noise": the largest difference of their sampled entries. ``stage``: the prefix of the loop's
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
            elif any(n in key for n in noise):
                worst("noise", (a[3:] - b[3:]).abs().max().item())
            else:
                for i, entry in enumerate(FINGERPRINT):
                    worst("entry" if entry.startswith("entry") else entry, (a[i] - b[i]).abs().item())
    for t, scores in enumerate(loop.scores):
        worst("scores", (scores - tensors[f"output.task{t}.scores"]).abs().max().item())
    return diffs


def exceeded(diffs: dict[str, float], tolerances: dict[str, float]) -> dict[str, float]:
    """The quantities whose difference is above their tolerance."""
    return {k: v for k, v in diffs.items() if not v <= tolerances.get(k, 0.0)}
