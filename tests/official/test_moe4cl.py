"""MOE4CL's mixture of adapters against the official MoE-Adapters code, by execution: the fixtures of
``tests/official/goldens/moe_adapters_repo.py`` (official outputs on seeded inputs with
the suite's parameters) fed to the suite's block, router and gating function."""

import contextlib
from unittest import mock

import pytest
import torch

from benchmarks.backbone.mlp_adapters import noisy_top_k_gates
from strategies.methods.moe4cl import MOE4CLConfig
from tests.official.goldens.golden import load_golden
from tests.official.goldens.moe_adapters_repo import (
    BATCH,
    EXPERTS,
    MODES,
    SEED,
    WIDTH,
    suite_block,
    suite_router,
)
from tests.official.helpers import GivenMask, close

ATOL = 1e-5  # float32 rounding: the official block runs length-first, nn.MultiheadAttention on permuted
# inputs, and sums the experts through SparseDispatcher's index_add; values are O(1-5)
GATE_ATOL = 1e-6  # float32 rounding of a 2-way softmax over the same logits
GRAD_ATOL = 2e-5  # float32 rounding, accumulated over a backward through attention and 2 experts


@contextlib.contextmanager
def _given_noise(noise: torch.Tensor | None):
    """The router's ``torch.randn`` returns the fixture's gate noise (and must be called only then)."""
    calls = []

    def randn(*size, **kwargs):
        assert tuple(size) == tuple(noise.shape), size
        calls.append(size)
        return noise.clone().to(kwargs.get("dtype") or noise.dtype)

    if noise is None:
        with mock.patch("torch.randn", side_effect=AssertionError("no gate noise expected")):
            yield
        return
    with mock.patch("torch.randn", side_effect=randn):
        yield
    assert len(calls) == 1, calls


@pytest.fixture(scope="module")
def block_fixture():
    return load_golden("moe4cl.block")[0]


def test_recipe_matches_the_fixture_sizes():
    cfg = MOE4CLConfig()
    assert (cfg.experts, cfg.top_k, cfg.bottleneck) == (EXPERTS, 2, 64)
    assert (cfg.adapter_dropout, cfg.adapter_scale) == (0.1, 0.1)


def _run_block(t: dict[str, torch.Tensor], mode: str):
    host = suite_block()
    host.load_tensors({k[6:]: v for k, v in t.items() if k.startswith("param.")})
    adapter = host.adapter
    host.train(mode == "train")
    adapter.eval_noise = mode == "eval_noisy"
    if mode == "train":
        for e, expert in enumerate(adapter.experts):
            expert.dropout = GivenMask(t[f"input.train.mask.{e}"], expert.dropout.p)
    expert_out = {}
    for e, expert in enumerate(adapter.experts):
        expert.register_forward_hook(lambda _m, _a, out, e=e: expert_out.__setitem__(e, out))
    x = t["input.x"].clone().requires_grad_(mode == "train")
    with _given_noise(t.get(f"input.{mode}.noise")), torch.set_grad_enabled(mode == "train"):
        out = host(x)
    return host, x, out, expert_out


@pytest.mark.parametrize("mode", MODES)
def test_block_gates_experts_and_output_equal_the_official(block_fixture, mode):
    t = block_fixture
    host, _, out, expert_out = _run_block(t, mode)
    close(f"{mode} gates", host.adapter.last_gates, t[f"output.{mode}.gates"], GATE_ATOL)
    for e in range(EXPERTS):
        close(f"{mode} expert {e}", expert_out[e], t[f"output.{mode}.expert.{e}"], ATOL)
    close(f"{mode} block", out, t[f"output.{mode}.block"], ATOL)


def test_block_gradients_equal_the_official(block_fixture):
    t = block_fixture
    host, x, out, _ = _run_block(t, "train")
    (out * t["input.cotangent"]).sum().backward()
    close("grad input", x.grad, t["grad.train.input.x"], GRAD_ATOL)
    named = dict(host.adapter.named_parameters())
    expected = {
        k.removeprefix("grad.train.adapter."): v for k, v in t.items() if k.startswith("grad.train.adapter.")
    }
    assert set(expected) == set(named)  # every trainable tensor of the block is compared
    for name, grad in expected.items():
        close(f"grad {name}", named[name].grad, grad, GRAD_ATOL)


def test_block_fixture_is_discriminating(block_fixture):
    """The three modes give different outputs, so a suite that mixed them up would fail."""
    t = block_fixture
    for a, b in (("train", "eval"), ("eval", "eval_noisy")):
        assert (t[f"output.{a}.gates"] - t[f"output.{b}.gates"]).abs().max() > 1e-2
        assert (t[f"output.{a}.block"] - t[f"output.{b}.block"]).abs().max() > 1e-4
    assert t["input.x"].shape[0] == BATCH and t["input.x"].shape[-1] == WIDTH


GATE_CASES = ("train_k2", "eval_k2", "train_k1", "eval_k1")


@pytest.mark.parametrize("case", GATE_CASES)
def test_gates_equal_the_official(case):
    t, _ = load_golden("moe4cl.gates")
    k = int(case[-1])
    noise = t.get(f"input.{case}.noise")
    x = t["input.x"].clone().requires_grad_(True)
    w_gate = t["param.w_gate"].clone().requires_grad_(True)
    w_noise = t["param.w_noise"].clone().requires_grad_(True)
    gates = noisy_top_k_gates(x, w_gate, w_noise, k, noise)
    close(f"{case} gates", gates, t[f"output.{case}.gates"], GATE_ATOL)
    (gates * t["input.cotangent"]).sum().backward()
    for name, tensor in (("w_gate", w_gate), ("w_noise", w_noise), ("x", x)):
        key = f"grad.{case}.{name}"
        if key in t:
            close(f"{case} grad {name}", tensor.grad, t[key], GATE_ATOL)
        else:  # the official w_noise has no gradient without noise; the suite's neither
            assert tensor.grad is None or not tensor.grad.any()
    # The official forward computes importance (gates.sum(0)) and load and discards them (no balance
    # loss, the suite has none either); equal gates give equal importance and, without noise or at
    # k = E, equal load (the count of positive gates).
    close(f"{case} importance", gates.sum(0), t[f"output.{case}.importance"], GATE_ATOL)
    if case != "train_k1":  # there the official load is _prob_in_top_k's smooth estimate
        close(f"{case} load", (gates > 0).sum(0).float(), t[f"output.{case}.load"], 0.0)


@pytest.mark.parametrize("case", ("train_k2", "eval_k2"))
def test_router_module_equals_the_official_gating(case):
    """The Router module (its noise draw and dtype handling), not only the gating function."""
    t, _ = load_golden("moe4cl.gates")
    router = suite_router(SEED)
    router.load_state_dict({k[6:]: v for k, v in t.items() if k.startswith("param.")})
    noise = t.get(f"input.{case}.noise")
    with _given_noise(noise):
        gates = router(t["input.x"], noisy=noise is not None)
    close(f"{case} router", gates, t[f"output.{case}.gates"], GATE_ATOL)
