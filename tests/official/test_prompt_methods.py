"""The suite's prompt methods against the official CODA-Prompt code (GT-RIPL/CODA-Prompt), by
execution: the fixtures of ``tests/official/goldens/coda_prompt_{repo,method}.py`` hold seeded
inputs, the suite's parameters and the official outputs and gradients; here the suite's components
get the same inputs and parameters and must give the same outputs, losses, gradients of every
trainable tensor, selections (exactly) and state across tasks.

Tolerances: every compared tensor is float32, computed by the official code and by the suite with
the same operations in a different order (fused or split projections, SDPA or an explicit softmax,
a matmul or an einsum). Selections are compared exactly.
"""

import pytest
import torch

from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
from strategies.methods.coda_prompt import CodaPrompt, component_weights
from strategies.methods.dualprompt import DualPrompt
from strategies.methods.l2p_pp import L2PPlusPlus
from tests.official.goldens.coda_prompt_method import CODA_CLASSES, CODA_CONFIG, CODA_TASKS
from tests.official.goldens.coda_prompt_repo import (
    DUAL_CONFIG,
    DUAL_TASK,
    L2P_CONFIG,
    finish_task,
    start_task,
    suite_strategy,
)
from tests.official.goldens.golden import load_golden

ATTENTION_ATOL = 1e-6  # float32: SDPA against q k^T softmax v over 128-wide rows, outputs of size ~1
ATTENTION_GRAD_ATOL = 1e-5  # float32: gradients of size up to ~12, sums over 3 x 5 tokens of 128-wide rows
PREFIX_ATOL = 0.0  # a prefix is selected prompt entries, copied: bit-identical
KEY_LOSS_ATOL = (
    5e-5  # float32: a sum of 80 (L2P) or 8 (DualPrompt) cosine terms, totals up to ~80 (spacing 8e-6)
)
GRAD_ATOL = 1e-6  # float32: gradients of size <= 7 through a normalised 256-wide dot product
ALPHA_ATOL = 1e-6  # float32: cosines of 256-wide vectors, one normalisation each side
CODA_PREFIX_ATOL = 1e-6  # float32: alpha-weighted sums of <= 6 prompts of size <= 1
ORTHOGONAL = 1e-6  # gram_schmidt="exact" works in float64 and returns float32: orthogonal to float32 rounding


def close(actual: torch.Tensor, expected: torch.Tensor, atol: float, what: str) -> float:
    """Assert ``|actual - expected| <= atol`` everywhere; return the largest difference."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    diff = (actual.detach().float() - expected.float()).abs().max().item() if actual.numel() else 0.0
    assert diff <= atol, f"{what}: max |suite - official| = {diff:.3g} > {atol:.3g}"
    return diff


def readout(prefix, probe_keys, probe_values) -> torch.Tensor:
    """The generator's scalar: a fixed linear read-out of a prefix (keys, values)."""
    return (prefix[0] * probe_keys).sum() + (prefix[1] * probe_values).sum()


def load_params(module: torch.nn.Module, tensors: dict, prefix: str) -> None:
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            parameter.copy_(tensors[f"{prefix}.{name}"])
            parameter.grad = None


# ---------------------------------------------------------------------- prefix attention
def test_prefix_attention_equals_the_official_output_and_gradients():
    t, meta = load_golden("prefix_attention")
    backbone = create_clip(BackboneSpec(TINY_MODEL, None))
    attention = backbone.model.visual.transformer.resblocks[0].attn
    with torch.no_grad():
        for name, parameter in attention.named_parameters():
            parameter.copy_(t[f"param.{name}"])
    attention.requires_grad_(True)
    tokens, keys, values = (
        t[f"input.{n}"].clone().requires_grad_() for n in ("tokens", "prefix_keys", "prefix_values")
    )
    assert attention.batch_first  # tokens are [B, N, width], as the official Attention takes them
    with backbone.visual_prefix({0: (keys, values)}):
        out = attention(tokens, tokens, tokens, need_weights=False)[0]
    close(out, t["output.attention"], ATTENTION_ATOL, "attention output")
    (out * t["input.grad_output"]).sum().backward()
    close(keys.grad, t["grad.prefix_keys"], ATTENTION_GRAD_ATOL, "grad of the prefix keys")
    close(values.grad, t["grad.prefix_values"], ATTENTION_GRAD_ATOL, "grad of the prefix values")
    close(tokens.grad, t["grad.tokens"], ATTENTION_GRAD_ATOL, "grad of the tokens")
    for name, parameter in attention.named_parameters():
        close(parameter.grad, t[f"grad.{name}"], ATTENTION_GRAD_ATOL, f"grad of {name}")


# ---------------------------------------------------------------------- L2P++
def test_l2p_pp_selection_prefix_key_loss_and_gradients_equal_the_official():
    t, meta = load_golden("l2p_pp.selection")
    strategy = suite_strategy(L2PPlusPlus, 6, meta["seed"], **L2P_CONFIG)
    load_params(strategy.pool, t, "param.pool")
    query = t["input.query"]
    for mode, train in (("train", True), ("eval", False)):
        prefixes, loss = strategy.prefixes(query, train=train)
        assert list(prefixes) == [L2P_CONFIG["prompt_layer"]]
        assert torch.equal(strategy.last_selection, t[f"output.{mode}.selection"]), f"{mode} selection"
        keys, values = prefixes[L2P_CONFIG["prompt_layer"]]
        close(keys, t[f"output.{mode}.prefix_keys"], PREFIX_ATOL, f"{mode} prefix keys")
        close(values, t[f"output.{mode}.prefix_values"], PREFIX_ATOL, f"{mode} prefix values")
        close(loss, t[f"output.{mode}.key_loss"], KEY_LOSS_ATOL, f"{mode} key loss")
        if train:
            (loss + readout((keys, values), t["input.probe_keys"], t["input.probe_values"])).backward()
    for name, parameter in strategy.pool.named_parameters():
        close(parameter.grad, t[f"grad.pool.{name}"], GRAD_ATOL, f"grad of pool.{name}")


# ---------------------------------------------------------------------- DualPrompt
def test_dualprompt_prompts_selection_key_loss_and_gradients_equal_the_official():
    t, meta = load_golden("dualprompt.selection")
    strategy = suite_strategy(DualPrompt, 10, meta["seed"], **DUAL_CONFIG)
    load_params(strategy.prompts, t, "param.prompts")
    start_task(strategy, DUAL_TASK, [2 * DUAL_TASK, 2 * DUAL_TASK + 1])
    query = t["input.query"]
    for mode, train in (("train", True), ("eval", False)):
        prefixes, loss = strategy.prefixes(query, train=train)
        assert sorted(prefixes) == [0, 1, 2, 3]
        total = loss
        for layer, prefix in prefixes.items():
            close(
                prefix[0], t[f"output.{mode}.prefix_keys.{layer}"], PREFIX_ATOL, f"{mode} keys, block {layer}"
            )
            close(
                prefix[1],
                t[f"output.{mode}.prefix_values.{layer}"],
                PREFIX_ATOL,
                f"{mode} values, block {layer}",
            )
            total = total + readout(prefix, t[f"input.probe_keys.{layer}"], t[f"input.probe_values.{layer}"])
        close(loss, t[f"output.{mode}.key_loss"], KEY_LOSS_ATOL, f"{mode} key loss")
        if train:
            total.backward()
        else:
            assert torch.equal(strategy.last_selection, t["output.eval.selection"]), "test-time E-prompt"
    for name, parameter in strategy.prompts.named_parameters():
        close(parameter.grad, t[f"grad.prompts.{name}"], GRAD_ATOL, f"grad of prompts.{name}")
    # Only the task's own E-prompt and key learn, in both.
    rows = strategy.prompts.e.grad.flatten(1).abs().sum(1) != 0
    assert rows.tolist() == [task == DUAL_TASK for task in range(DUAL_CONFIG["pool_size"])]


# ---------------------------------------------------------------------- CODA-Prompt
def coda_forward(strategy: CodaPrompt, t: dict, train: bool, tag: str) -> torch.Tensor:
    """Compare alpha, the prefixes and the loss of blocks 0..3 with the fixture's ``output.{tag}``;
    return loss + the probes' read-out."""
    query = t["input.query"]
    prefixes, loss = strategy.prefixes(query, train=train)
    assert sorted(prefixes) == CODA_CONFIG["prompt_layers"]
    keys = strategy.used(strategy.components.keys, train)
    attention = strategy.used(strategy.components.attention, train)
    total = loss
    for i, layer in enumerate(CODA_CONFIG["prompt_layers"]):
        alpha = component_weights(query, keys[i], attention[i])
        close(alpha, t[f"output.{tag}.alpha"][layer], ALPHA_ATOL, f"{tag} alpha, block {layer}")
        prefix = prefixes[layer]
        close(
            prefix[0], t[f"output.{tag}.prefix_keys"][layer], CODA_PREFIX_ATOL, f"{tag} keys, block {layer}"
        )
        close(
            prefix[1],
            t[f"output.{tag}.prefix_values"][layer],
            CODA_PREFIX_ATOL,
            f"{tag} values, block {layer}",
        )
        total = total + readout(prefix, t["input.probe_keys"][layer], t["input.probe_values"][layer])
    close(loss, t[f"output.{tag}.loss"], 0.0, f"{tag} loss (ortho penalty at weight 0)")
    return total


def learning_rows(grad: torch.Tensor) -> list[bool]:
    """Which components got a gradient, over the layers."""
    return (grad.transpose(0, 1).flatten(1) != 0).any(1).tolist()


def compare_coda_grads(strategy: CodaPrompt, t: dict, prefix: str) -> None:
    for name, parameter in strategy.components.named_parameters():
        expected = t[f"{prefix}.{name}"]
        close(parameter.grad, expected, GRAD_ATOL, f"{prefix}.{name}")
        assert learning_rows(parameter.grad) == learning_rows(expected), f"{prefix}.{name}: learning slices"


def coda_strategy(seed: int) -> CodaPrompt:
    return suite_strategy(CodaPrompt, CODA_CLASSES, seed, **CODA_CONFIG)


def test_coda_prompt_alpha_prompts_loss_and_gradients_equal_the_official():
    t, meta = load_golden("coda_prompt.attention")
    strategy = coda_strategy(meta["seed"])
    start_task(strategy, 0, CODA_TASKS[0])
    finish_task(strategy, 0, CODA_TASKS[0])
    start_task(strategy, 1, CODA_TASKS[1])
    load_params(strategy.components, t, "param.components")
    coda_forward(strategy, t, train=True, tag="train").backward()
    compare_coda_grads(strategy, t, "grad.components")
    assert learning_rows(strategy.components.keys.grad) == [False, False, True, True, False, False]
    finish_task(strategy, 1, CODA_TASKS[1])
    coda_forward(strategy, t, train=False, tag="eval")


def fed_draws(monkeypatch, draws: dict[str, torch.Tensor]) -> None:
    """``torch.randn`` returns the official draws in the order ``CodaPrompt.setup_task`` asks for
    them (the official order): per layer, keys, attention vectors, prompts, row after row."""
    queue = [
        row
        for layer in range(len(CODA_CONFIG["prompt_layers"]))
        for name in ("keys", "attention", "prompts")
        for row in draws[name][layer]
    ]

    def randn(*size, generator=None, dtype=None, device=None, **kwargs):
        row = queue.pop(0)
        assert tuple(size) == tuple(row.shape), (size, row.shape)
        return row.to(dtype=dtype or row.dtype, device=device)

    monkeypatch.setattr(torch, "randn", randn)


def new_rows(tensor: torch.Tensor, task: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(old rows [layers, s, n], new rows [layers, per task, n]) of a component tensor at ``task``."""
    per_task = CODA_CONFIG["components"] // len(CODA_TASKS)
    flat = tensor.detach().flatten(2).double()
    return flat[:, : task * per_task], flat[:, task * per_task : (task + 1) * per_task]


def orthogonality(tensor: torch.Tensor, task: int) -> float:
    """max |<new row, old row / |old row|>| of the new slice at ``task``."""
    old, new = new_rows(tensor, task)
    return (new @ torch.nn.functional.normalize(old, dim=-1).transpose(1, 2)).abs().max().item()


def set_components(strategy: CodaPrompt, values: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, parameter in strategy.components.named_parameters():
            parameter.copy_(values[name])
            parameter.grad = None


def initialised(strategy, task, classes, before, monkeypatch, draws=None) -> dict[str, torch.Tensor]:
    """The suite's tensors after ``setup_task(task)`` from ``before``, with the official ``draws``
    (or its own)."""
    set_components(strategy, before)
    with monkeypatch.context() as patch:
        if draws is not None:
            fed_draws(patch, draws)
        start_task(strategy, task, classes)
    return {n: p.detach().clone() for n, p in strategy.components.named_parameters()}


GS_SAME_DRAW_ATOL = (
    2e-7  # float32 classical Gram-Schmidt, projections summed in another order; rows of size <= 1
)
GS_EXACT_ATOL = 2e-7  # float32 official against the float64 QR on orthonormal old rows: float32 rounding only
GS_TRAINED = 1e-3  # the official new rows are at least this far from orthogonal to trained old rows
GS_DIFFERS = 1e-4  # exact against official on trained old rows: far above the rounding of unit rows
#: max |suite - official| and max |<new, old>| per (task, mode, tensor), for the report
GS_NUMBERS: dict[tuple, tuple[float, float]] = {}


def test_coda_prompt_state_across_three_tasks_against_the_official(monkeypatch):
    """Three tasks: at each, the forward, the gradients and which slices learn (earlier ones frozen);
    at tasks 1 and 2, the new slice's initialisation. With the official random draws,
    ``gram_schmidt="official"`` gives the official rows; ``"exact"`` gives rows orthogonal to the old
    ones, which the official ones are not once the old rows have trained (both agree from orthonormal
    old rows). The official state is then loaded, so that the next forward compares."""
    t, meta = load_golden("coda_prompt.tasks")
    strategies = {
        mode: suite_strategy(CodaPrompt, CODA_CLASSES, meta["seed"], **CODA_CONFIG, gram_schmidt=mode)
        for mode in ("official", "exact")
    }
    strategy = strategies["official"]
    names = [name for name, _ in strategy.components.named_parameters()]
    per_task = CODA_CONFIG["components"] // len(CODA_TASKS)
    start_task(strategy, 0, CODA_TASKS[0])
    start_task(strategies["exact"], 0, CODA_TASKS[0])
    set_components(strategy, {n: t[f"param.task0.{n}"] for n in names})
    for task, classes in enumerate(CODA_TASKS):
        if task:
            for suite in strategies.values():
                finish_task(suite, task - 1, CODA_TASKS[task - 1])
            before = {n: t[f"state.task{task - 1}.{n}"] if task > 1 else t[f"param.task0.{n}"] for n in names}
            trained = {n: before[n] + t[f"input.task{task - 1}.update.{n}"] for n in names}
            official = {n: t[f"state.task{task}.{n}"] for n in names}
            draws = {n: t[f"state.task{task}.draws.{n}"] for n in names}
            stop = (task + 1) * per_task
            # Its own draws: old rows kept bit for bit, later rows zero, new rows of unit length.
            for mode, suite in strategies.items():
                own = initialised(suite, task, classes, trained, monkeypatch)
                for name in names:
                    assert torch.equal(own[name][:, : task * per_task], official[name][:, : task * per_task])
                    assert not own[name][:, stop:].any() and not official[name][:, stop:].any()
                    norms = new_rows(own[name], task)[1].norm(dim=-1)
                    close(
                        norms, torch.ones_like(norms), 1e-6, f"{mode} {name}: unit new rows"
                    )  # float32 norm
            # The official draws, mode "official": the official classical Gram-Schmidt, to rounding.
            same = initialised(strategy, task, classes, trained, monkeypatch, draws)
            for name in names:
                diff = close(
                    same[name], official[name], GS_SAME_DRAW_ATOL, f"task {task} {name}: official GS"
                )
                GS_NUMBERS[task, "official", name] = (diff, orthogonality(same[name], task))
                assert orthogonality(official[name], task) > GS_TRAINED, "trained old rows are not orthogonal"
            # Mode "exact": orthogonal to the old rows' span; it differs where they are not orthonormal.
            exact = initialised(strategies["exact"], task, classes, trained, monkeypatch, draws)
            for name in names:
                cross = orthogonality(exact[name], task)
                assert cross <= ORTHOGONAL, f"task {task} {name}: exact GS not orthogonal ({cross:.3g})"
                diff = (exact[name] - official[name]).abs().max().item()
                GS_NUMBERS[task, "exact", name] = (diff, cross)
                assert diff > GS_DIFFERS, f"task {task} {name}: exact GS equals the official on trained rows"
            if task == 1:  # from orthonormal old rows both are exact: the same draws give the same rows
                draws = {n: t[f"state.task1.from_orthonormal.draws.{n}"] for n in names}
                untrained = {n: t[f"param.task0.{n}"] for n in names}
                for mode, suite in strategies.items():
                    rows = initialised(suite, 1, classes, untrained, monkeypatch, draws)
                    for name in names:
                        expected = t[f"state.task1.from_orthonormal.{name}"]
                        diff = close(
                            rows[name], expected, GS_EXACT_ATOL, f"{mode} {name}, orthonormal old rows"
                        )
                        GS_NUMBERS["orthonormal", mode, name] = (diff, orthogonality(rows[name], 1))
            # From here on the official state, so that forward and gradients compare.
            set_components(strategy, official)
        coda_forward(strategy, t, train=True, tag=f"task{task}").backward()
        compare_coda_grads(strategy, t, f"grad.task{task}")
        expected = [task * per_task <= m < (task + 1) * per_task for m in range(CODA_CONFIG["components"])]
        assert learning_rows(strategy.components.prompts.grad) == expected  # earlier slices frozen
    finish_task(strategy, 2, CODA_TASKS[2])
    coda_forward(strategy, t, train=False, tag="eval")


@pytest.mark.parametrize(
    "component",
    [
        "prefix_attention",
        "l2p_pp.selection",
        "dualprompt.selection",
        "coda_prompt.attention",
        "coda_prompt.tasks",
    ],
)
def test_fixture_comes_from_the_pinned_official_code(component):
    _, meta = load_golden(component)
    assert meta["repository"] == "GT-RIPL/CODA-Prompt"
    assert meta["commit"] == "6417d4f68754be68b697c7ca2323ee61e791e1a3"
