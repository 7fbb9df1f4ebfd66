"""APER's adapter, cosine head and prototype classifier against the official RevisitingCIL code, by
execution: the fixtures of ``tests/official/goldens/revisitingcil_repo.py`` (official
outputs on seeded inputs with the suite's parameters) fed to the suite's components."""

import contextlib
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from strategies.methods.aper_adapter import AperAdapter, AperConfig, prototype_scores
from tests.official.goldens.golden import load_golden
from tests.official.goldens.revisitingcil_repo import (
    SEED,
    TASK_CLASSES,
    suite_adapter_block,
    suite_head,
)
from tests.official.helpers import GivenMask, close

ATOL = 1e-5  # float32 rounding: different attention kernels (nn.MultiheadAttention against the official
# q/k/v bmm) on values of O(1-5)
GRAD_ATOL = 2e-5  # float32 rounding accumulated over a backward through attention and the adapter
HEAD_ATOL = 1e-6  # float32 rounding of normalised dot products of O(1)
PROTO_ATOL = 1e-6  # float32 rounding of a class mean of 4 features of O(1-5)


@pytest.fixture(scope="module")
def adapter_fixture():
    return load_golden("aper_adapter.adapter")[0]


@pytest.fixture(scope="module")
def head_fixture():
    return load_golden("aper_adapter.head")[0]


def _run(t: dict[str, torch.Tensor], mode: str, unit: str):
    host = suite_adapter_block()
    host.load_tensors({k[6:]: v for k, v in t.items() if k.startswith("param.")})
    host.train(mode == "train")
    expert = host.adapter.experts[0]
    if mode == "train":
        expert.dropout = GivenMask(t["input.train.mask"], expert.dropout.p)
    x = t["input.x"].clone().requires_grad_(True)
    out = host.adapter(x, batch_first=True) if unit == "adapter" else host(x)
    return host, x, out


@pytest.mark.parametrize("mode", ("train", "eval"))
@pytest.mark.parametrize("unit", ("adapter", "block"))
def test_adapter_output_equals_the_official(adapter_fixture, mode, unit):
    _, _, out = _run(adapter_fixture, mode, unit)
    close(f"{mode} {unit}", out, adapter_fixture[f"output.{mode}.{unit}"], ATOL)


@pytest.mark.parametrize("unit", ("adapter", "block"))
def test_adapter_gradients_equal_the_official(adapter_fixture, unit):
    t = adapter_fixture
    host, x, out = _run(t, "train", unit)
    (out * t["input.cotangent"]).sum().backward()
    close(f"{unit} grad input", x.grad, t[f"grad.train.{unit}.input.x"], GRAD_ATOL)
    named = dict(host.adapter.named_parameters())
    prefix = f"grad.train.{unit}.adapter."
    expected = {k.removeprefix(prefix): v for k, v in t.items() if k.startswith(prefix)}
    assert set(expected) == set(named)  # every trainable tensor of the adapter is compared
    for name, grad in expected.items():
        close(f"{unit} grad {name}", named[name].grad, grad, GRAD_ATOL)


def test_head_initial_values_equal_the_official(head_fixture):
    """The same draws from the global generator after the same seed: the same init, sigma = 1."""
    head = suite_head(SEED)
    close("init weight", head.weight, head_fixture["output.init.weight"], 0.0)
    close("init sigma", head.sigma.reshape(1), head_fixture["output.init.sigma"], 0.0)


def test_head_logits_loss_and_gradients_equal_the_official(head_fixture):
    t = head_fixture
    head = suite_head(SEED)
    head.load_state_dict(
        {k.removeprefix("param.head."): v for k, v in t.items() if k.startswith("param.head.")}
    )
    logits = head(t["input.head.features"])
    loss = F.cross_entropy(logits, t["input.head.labels"])  # the suite's task-1 loss (CLIPStrategy's CE)
    loss.backward()
    close("head logits", logits, t["output.head.logits"], HEAD_ATOL)
    close("head loss", loss, t["output.head.loss"], HEAD_ATOL)
    close("grad weight", head.weight.grad, t["grad.head.weight"], HEAD_ATOL)
    close("grad sigma", head.sigma.grad, t["grad.head.sigma"], HEAD_ATOL)


class _Branches:
    """A backbone whose image encoder returns a given feature: the pretrained one while its MLP
    adapters are off, the adapted one otherwise (inputs ``[B, 2, d]``)."""

    def __init__(self) -> None:
        self.adapters_on = True
        self.mlp_adapter_modules = nn.ModuleDict()

    @contextlib.contextmanager
    def mlp_adapters(self, enabled: bool):
        before, self.adapters_on = self.adapters_on, enabled
        try:
            yield
        finally:
            self.adapters_on = before

    def encode_image(self, images: torch.Tensor, normalize: bool) -> torch.Tensor:
        assert not normalize  # phi is unnormalised, as the official features
        return images[:, 1] if self.adapters_on else images[:, 0]

    def eval(self):
        return self


def test_features_prototypes_and_scores_equal_the_official(head_fixture):
    """phi = [pretrained, adapted]; after each task the prototypes (class means, rows in class order)
    and sigma cos(phi, prototypes) with sigma = proto_scale = the official fresh head's 1."""
    t = head_fixture
    backbone = _Branches()
    strategy = SimpleNamespace(backbone=backbone, head=None, prototypes=torch.zeros(0, 2 * 256))
    test_phi = AperAdapter.phi(strategy, t["input.test.phi"])
    scale = AperConfig().proto_scale
    for task, classes in enumerate(TASK_CLASSES):
        close(f"task {task} features", test_phi, t[f"output.task{task}.features"], 0.0)
        phi = AperAdapter.phi(strategy, t[f"input.task{task}.phi"])
        strategy.phi_dataset = lambda _dataset, phi=phi, task=task: (phi, t[f"input.task{task}.labels"])
        strategy.adapted_dataset = SimpleNamespace(eval=lambda: None)
        AperAdapter.finish_task(strategy, task, list(classes))
        close(f"task {task} prototypes", strategy.prototypes, t[f"output.task{task}.prototypes"], PROTO_ATOL)
        assert scale == t[f"output.task{task}.sigma"].item()
        scores = prototype_scores(test_phi, strategy.prototypes, scale)
        close(f"task {task} scores", scores, t[f"output.task{task}.logits"], HEAD_ATOL)
