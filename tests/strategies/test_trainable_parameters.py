"""No silent no-op in the base: every ``nn.Parameter`` with ``requires_grad`` that a strategy holds
(an attribute, in a module, in a list or dict) is optimised without a hook; an epoch that changes
nothing warns once, naming the strategy and the task; ``trainable_parameter_count`` counts every
optimised tensor once, over the whole stream."""

import warnings

import pytest
import torch
from torch import nn

from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
from benchmarks.data.class_orders import seeded_order
from benchmarks.data.datasets import load_dataset
from benchmarks.data.streams import build_stream
from benchmarks.data.transforms import eval_transform
from strategies.base import CLIPStrategy
from strategies.config import StrategyConfig
from strategies.settings import RunSettings


class Residuals(CLIPStrategy):
    """CLIP's text classifier plus learned residuals, held four ways, none named in a hook."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        d = self.backbone.embed_dim
        self.text_residual = nn.Parameter(torch.zeros(len(self.class_names), d))  # an attribute
        self.head = nn.Linear(d, d, bias=False)  # a module
        nn.init.zeros_(self.head.weight)
        self.scales = [nn.Parameter(torch.ones(()))]  # in a list
        self.biases = {"logit": nn.Parameter(torch.zeros(()))}  # in a dict
        self.frozen = nn.Parameter(torch.ones(3), requires_grad=False)  # not trainable: left alone

    def setup_task(self, task, classes):
        if task == 0:
            self.add_adapter("visual", tower="visual")
            self.backbone.set_adapters(visual="visual", text=None)
        self.backbone.set_trainable(["visual"])

    def compute_logits(self, images):
        image = self.backbone.encode_image(images)
        image = image + self.head(image)
        text = self.text_features(self.current_classes) + self.text_residual[self.current_classes]
        return self.scales[0] * self.backbone.logit_scale * image @ text.T + self.biases["logit"]


class Still(CLIPStrategy):
    """A parameter whose gradient is always zero (and whose value is zero, so weight decay keeps it):
    no optimised tensor changes."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.unused = nn.Parameter(torch.zeros(5))

    def compute_logits(self, images):
        text = self.text_features(self.current_classes)
        return self.backbone.logit_scale * self.backbone.encode_image(images) @ text.T + 0 * self.unused.sum()


@pytest.fixture(scope="module")
def stream():
    data = load_dataset("synthetic", n_classes=12, n_train_per_class=4, n_test_per_class=1)
    return build_stream(data, 2, seeded_order(12), eval_transform(32), eval_transform(32))


def _strategy(cls, stream, epochs=1):
    config = StrategyConfig.from_dict({"epochs": epochs, "batch_size": 12, "lora_rank": 2, "lr": 0.01})
    return cls(
        backbone=create_clip(BackboneSpec(TINY_MODEL, "synthetic")),
        class_names=stream.class_names,
        config=config,
        settings=RunSettings(show_progress=False),
    )


def test_parameters_a_strategy_holds_are_optimised_and_counted_without_a_hook(stream):
    strategy = _strategy(Residuals, stream)
    before = {name: p.detach().clone() for name, p in strategy.trainable_parameters().items()}
    torch.manual_seed(0)
    strategy.train(stream.train_stream[0])
    held = {"text_residual", "head.weight", "scales.0", "biases.logit"}
    named = strategy.trainable_parameters()
    assert held <= set(named) and "frozen" not in named
    for name in held:
        assert not torch.equal(before[name], named[name].detach()), f"{name} did not move"
    lora = sum(p.numel() for p in strategy.backbone.lora_parameters("visual"))
    d, classes = strategy.backbone.embed_dim, len(stream.class_names)
    expected = lora + classes * d + d * d + 1 + 1  # by hand: adapter, residual, head, scale, bias
    assert strategy.trainable_parameter_count() == expected
    torch.manual_seed(1)
    strategy.train(stream.train_stream[1])  # the same tensors again: still counted once
    assert strategy.trainable_parameter_count() == expected


def test_an_epoch_that_changes_nothing_warns_once_naming_the_strategy_and_task(stream):
    strategy = _strategy(Still, stream, epochs=3)
    strategy.name = "still"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        strategy.train(stream.train_stream[0])
    still = [
        w for w in caught if issubclass(w.category, RuntimeWarning) and "changed nothing" in str(w.message)
    ]
    assert len(still) == 1  # three still epochs, one warning
    assert "still task 1:" in str(still[0].message) and "1 optimised tensor(s)" in str(still[0].message)


def test_a_strategy_that_trains_does_not_warn(stream):
    strategy = _strategy(Residuals, stream, epochs=2)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*changed nothing")
        strategy.train(stream.train_stream[0])
