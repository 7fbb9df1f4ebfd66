"""No silent no-op: on the smoke-baselines recipe, every registered strategy that trains anything
moves every tensor it trains in task 1, and its training loss falls (by 10 %, or below 1.0).

Training stops at the end of the first epoch where the loss has fallen so (``TrainingRecord``): the
epochs after it cannot undo what is asserted, and they were most of this module's time (AdapterVLM's
70 epochs, 200 s on 2 cores).

Parametrised over the registry, so a new strategy file is covered without an edit here."""

import pytest
import torch
from avalanche.core import SupervisedPlugin

from benchmarks.backbone import BackboneSpec, create_clip
from benchmarks.data.class_orders import resolve_class_order
from benchmarks.data.streams import build_stream
from benchmarks.data.transforms import eval_transform, train_transform
from benchmarks.runner import building
from benchmarks.runner.suites import expand, load_suite
from strategies.registry import available, get_strategy
from strategies.settings import RunSettings

pytestmark = [pytest.mark.slow, pytest.mark.spread]  # each strategy's case on any worker: no module fixture

# Known misses, each with its measured numbers; strict, so a fix shows up as an unexpected pass.
KNOWN_MISSES = {
    "l2p_pp": "official batch 128 and 20 epochs give 60 steps a task (the last partial batch dropped); "
    "the loss is dominated by the official key loss, summed over every (image, key selected in the "
    "batch) pair, 128 x 128 x 5 terms of (1 - cos), which falls slowly: 83,033 to 79,380 (-4.4 %)",
    "dualprompt": "official batch 128 and 20 epochs give 60 steps a task (the last partial batch dropped); "
    "the key loss summed over 128 images at each of its 3 E layers' keys dominates and falls slowly: "
    "265.1 to 252.1 (-4.9 %)",
}  # Aper-Adapter's miss (80 steps) went with its official batch of 48 (issue 21)


class TrainingRecord(SupervisedPlugin):
    """What the optimiser trains at the start of the task, and the mean loss of every epoch until the
    loss has fallen as asserted; then training stops (in each later phase, after its first epoch)."""

    def __init__(self) -> None:
        super().__init__()
        self.initial: dict[int, torch.Tensor] = {}
        self.tensors: list[torch.Tensor] = []
        self.epoch_losses: list[float] = []
        self._losses: list[float] = []
        self.shown = False  # the loss has fallen as asserted: the record is complete

    def before_training_epoch(self, strategy, *args, **kwargs) -> None:
        if not self.tensors:  # the optimiser of this task exists now (make_optimizer ran)
            self.tensors = [p for group in strategy.optimizer.param_groups for p in group["params"]]
            self.initial = {id(p): p.detach().clone() for p in self.tensors}
        self._losses = []

    def after_training_iteration(self, strategy, *args, **kwargs) -> None:
        self._losses.append(float(strategy.loss.detach()))

    def after_training_epoch(self, strategy, *args, **kwargs) -> None:
        if not self.shown:
            self.epoch_losses.append(sum(self._losses) / len(self._losses))
            self.last_epoch_steps = list(self._losses)
            first, last = self.epoch_losses[0], self.epoch_losses[-1]
            self.shown = len(self.epoch_losses) > 1 and loss_fell(first, last)
        if self.shown:
            strategy.stop_training()

    def start_and_end_loss(self) -> tuple[float, float]:
        """Mean loss of the first and the last epoch; with one epoch, of its first and last quarter of
        steps."""
        if len(self.epoch_losses) > 1:
            return self.epoch_losses[0], self.epoch_losses[-1]
        steps = self.last_epoch_steps
        quarter = max(1, len(steps) // 4)
        return sum(steps[:quarter]) / quarter, sum(steps[-quarter:]) / quarter


def loss_fell(first: float, last: float) -> bool:
    return last <= 0.9 * first or last < 1.0


def _trains_something(name: str) -> bool:
    return get_strategy(name).Config.min_epochs > 0


@pytest.mark.parametrize("name", [n for n in available() if _trains_something(n)])
def test_every_trained_tensor_moves_and_the_loss_falls_in_task_1(name, request):
    if name in KNOWN_MISSES:
        request.applymarker(pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[name]))
    (spec,) = expand(load_suite("smoke-baselines"), strategies=[name], seeds=[0], device="cpu")
    resolved = building.resolve(spec, "data")
    strategy_cls, config = resolved.strategy_cls, resolved.strategy_cfg
    data = building.load_run_data(spec, "data")
    torch.manual_seed(0)
    backbone = create_clip(BackboneSpec(spec.backbone["model"], spec.backbone["pretrained"]))
    record = TrainingRecord()
    strategy = strategy_cls(
        backbone=backbone,
        class_names=data.class_names,
        config=config,
        settings=RunSettings(show_progress=False, seed=0),
        plugins=[record],
    )
    stream = build_stream(
        data,
        spec.n_tasks,
        resolve_class_order(spec.class_order, data.n_classes, spec.dataset),
        train_transform(backbone.image_size, backbone.mean, backbone.std, config.train_augmentation),
        eval_transform(backbone.image_size, backbone.mean, backbone.std),
    )
    strategy.learn(stream.train_stream[0])
    assert record.tensors, f"{name} trained nothing in task 1"
    still = [tuple(p.shape) for p in record.tensors if torch.equal(p.detach(), record.initial[id(p)])]
    assert not still, (
        f"{name}: {len(still)} of {len(record.tensors)} trained tensors never moved: {still[:5]}"
    )
    first, last = record.start_and_end_loss()
    assert loss_fell(first, last), f"{name}: loss {first:.3f} -> {last:.3f} over {record.epoch_losses}"
