"""A fast dev run's cap is one for every framework: with a cap of ``K`` batches and two epochs,
each epoch trains on exactly ``K`` batches, in the suite's own strategies and in the Avalanche,
Mammoth and PyCIL adapters (``benchmarks.data.loaders.FirstBatches``). A cap that ended the whole
task after ``K`` batches (Avalanche's ``stop_training``) would give ``[K]``, not ``[K, K]``.

Every framework trains on 6 training images a class, 4 classes a task (``small_stream``), in
batches of 4: 6 batches an epoch uncapped."""

import sys
from pathlib import Path

import pytest
import torch
from avalanche.core import SupervisedPlugin

from strategies.settings import RunSettings
from tests.strategies import test_mammoth_upstream_habits as mammoth_habits
from tests.strategies import test_pycil_upstream_habits as pycil_habits

K = 2  # batches a training epoch may take
ORDER = list(range(12))


class EpochCounter(SupervisedPlugin):
    """The batches of each training epoch, as Avalanche's loop ran them."""

    def __init__(self) -> None:
        super().__init__()
        self.epochs: list[int] = []
        self.batches = 0

    def before_training_epoch(self, strategy, *args, **kwargs):
        self.batches = 0

    def after_training_iteration(self, strategy, *args, **kwargs):
        self.batches += 1

    def after_training_epoch(self, strategy, *args, **kwargs):
        self.epochs.append(self.batches)


def _backbone():
    from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip

    torch.manual_seed(0)
    return create_clip(BackboneSpec(TINY_MODEL, "synthetic"))


def _runner_arguments(cap):
    return {"settings": RunSettings(show_progress=False, seed=0, train_batches=cap)}


@pytest.mark.parametrize("cap, expected", [(K, [K, K]), (None, [6, 6])])
def test_the_suites_own_strategy_trains_every_epoch_on_the_capped_batches(stream, cap, expected):
    from strategies.methods.finetune import Finetune

    counter = EpochCounter()
    strategy = Finetune(
        backbone=_backbone(),
        class_names=stream.class_names,
        config=Finetune.Config(epochs=2, batch_size=4, lora_rank=2),
        plugins=[counter],
        **_runner_arguments(cap),
    )
    strategy.learn(stream.train_stream[0])
    assert counter.epochs == expected


@pytest.mark.parametrize("cap, expected", [(K, [K, K]), (None, [6, 6])])
def test_the_avalanche_adapter_trains_every_epoch_on_the_capped_batches(stream, cap, expected):
    from strategies.registry import get_strategy

    cls = get_strategy("avalanche:Naive")
    counter = EpochCounter()
    strategy = cls(
        backbone=_backbone(),
        class_names=stream.class_names,
        config=cls.Config(epochs=2, batch_size=4),
        plugins=[counter],
        **_runner_arguments(cap),
    )
    strategy.learn(stream.train_stream[0])
    assert counter.epochs == expected


@pytest.fixture
def mammoth_checkout(monkeypatch):
    monkeypatch.syspath_prepend(str(mammoth_habits.SHAPED))
    yield
    mammoth_habits._forget_the_checkout()  # its top-level names are Mammoth's; leave none for other tests


def _epochs_observed(observe, seen: list[int]):
    """``observe`` recording the epoch each batch is given with."""

    def counted(self, *args, epoch=None, **kwargs):
        seen.append(epoch)
        return observe(self, *args, epoch=epoch, **kwargs)

    return counted


def _per_epoch(seen: list[int]) -> list[int]:
    return [seen.count(epoch) for epoch in sorted(set(seen))]


# Mammoth's own shape (a fake checkout's model) and the example ER written in it (examples/mammoth_er)
MAMMOTH_MODELS = {
    "checkout": ("models.sgd_like", "SgdLike", {"lr": 1e-3}),
    "example": ("mammoth_er.model", "ER", {}),
}


@pytest.mark.parametrize("model_from", sorted(MAMMOTH_MODELS))
@pytest.mark.parametrize("cap, expected", [(K, [K, K]), (None, [6, 6])])
def test_the_mammoth_adapter_trains_every_epoch_on_the_capped_batches(
    stream, monkeypatch, request, model_from, cap, expected
):
    from strategies.registry import get_strategy

    module, attr, options = MAMMOTH_MODELS[model_from]
    if model_from == "checkout":
        request.getfixturevalue("mammoth_checkout")
    else:
        monkeypatch.syspath_prepend(str(Path(__file__).parents[2] / "examples" / "mammoth_er"))
    name = f"mammoth:{module}:{attr}"
    cls = get_strategy(name)
    model = getattr(sys.modules[module], attr)
    seen: list[int] = []
    monkeypatch.setattr(model, "observe", _epochs_observed(model.observe, seen))
    strategy = cls(
        backbone=_backbone(),
        class_names=stream.class_names,
        config=cls.Config.from_dict({"batch_size": 4, "epochs": 2, **options}, name),
        **_runner_arguments(cap),
    )
    strategy.learn(stream.train_stream[0])
    assert _per_epoch(seen) == expected


@pytest.mark.parametrize("cap, expected", [(K, [K, K]), (None, [6, 6])])
def test_the_pycil_adapter_trains_every_epoch_on_the_capped_batches(stream, monkeypatch, cap, expected):
    from strategies.frameworks.pycil_config import PyCILConfig
    from strategies.registry import get_strategy

    monkeypatch.syspath_prepend(str(pycil_habits.SHAPED))
    cls = get_strategy(pycil_habits.ICARL)
    module = sys.modules["pycil_learners.icarl_like"]
    monkeypatch.setattr(module, "batch_size", 4)  # the learner's own constant: 6 batches a task
    config, _ = PyCILConfig(args={"memory_size": 12}).with_epoch_cap(2)  # init_epoch 16 -> 2
    strategy = cls(
        backbone=_backbone(), class_names=stream.class_names, config=config, **_runner_arguments(cap)
    )
    ends = []  # the training steps taken when each epoch's scheduler steps
    step = torch.optim.lr_scheduler.MultiStepLR.step

    def stepped(self, *args, **kwargs):
        ends.append(strategy.train_iterations)
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.lr_scheduler.MultiStepLR, "step", stepped)
    strategy.learn(stream.train_stream[0])
    assert strategy.learner.epochs_run == [2]
    # the first step is the scheduler's own, when it is built
    assert [b - a for a, b in zip(ends, ends[1:])] == expected
