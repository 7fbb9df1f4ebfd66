"""The bare open_clip reference (``benchmarks.tools.reference``): it holds no code of the suite, its
trainable sets are built as described, a new LoRA or adapter changes no feature, and its op counts
are positive and deterministic. The tiny CLIP, random weights: no assertion reads a time."""

import ast
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.backbone import TINY_MODEL  # read through loading: the tiny model's config joins open_clip's
from benchmarks.tools import reference
from benchmarks.tools.reference import TrainableSet

BLOCKS = 4  # the tiny CLIP's blocks in each tower


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return reference.load_model(TINY_MODEL)


@pytest.fixture(scope="module")
def batch():
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(6, 3, 32, 32, generator=generator)
    targets = torch.tensor([0, 1, 2, 0, 1, 2])
    tokens = reference.tokenize(TINY_MODEL, ["a photo of a cat.", "a photo of a dog.", "a photo of a ship."])
    return images, targets, tokens


def test_the_reference_imports_only_open_clip_torch_and_the_standard_library():
    tree = ast.parse(Path(reference.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            imported.add(node.module.split(".")[0])
    outside = {name for name in imported if name not in sys.stdlib_module_names}
    assert outside == {"open_clip", "torch", "safetensors"}, outside  # safetensors: a weight file alone


@pytest.mark.parametrize("towers", [("visual",), ("visual", "text")])
def test_the_lora_reference_trains_four_tensors_a_block_of_each_tower(model, towers):
    copy, params = reference.prepare(model, "step", TrainableSet("lora_kv", towers, rank=4, scaling=0.25))
    assert len(params) == 4 * BLOCKS * len(towers)
    trainable = [p for p in copy.parameters() if p.requires_grad]
    assert len(trainable) == len(params) and {id(p) for p in trainable} == {id(p) for p in params}
    assert not any(p.requires_grad for p in model.parameters())  # the original stays frozen


def test_a_new_lora_or_adapter_leaves_the_features_exactly_as_the_frozen_model_gives_them(model, batch):
    images, _, tokens = batch
    with torch.no_grad():
        image, text = model.encode_image(images), model.encode_text(tokens)
        for trainable in (
            TrainableSet("lora_kv", ("visual", "text"), rank=4, scaling=0.25),
            TrainableSet("mlp_adapter", ("visual", "text"), bottleneck=8),
            TrainableSet("mlp_adapter", ("visual", "text"), bottleneck=8, experts=2, top_k=2),
        ):
            copy, _ = reference.prepare(model, "step", trainable)
            assert torch.equal(copy.encode_image(images), image), trainable.kind
            assert torch.equal(copy.encode_text(tokens), text), trainable.kind


def test_a_trained_lora_changes_the_fused_kv_rows_and_not_q(model):
    copy, _ = reference.prepare(model, "step", TrainableSet("lora_kv", ("visual",), rank=2))
    attn = copy.visual.transformer.resblocks[0].attn
    lora = attn.parametrizations.in_proj_weight[0]
    with torch.no_grad():
        lora.b_k.fill_(1.0)
        weight, base = attn.in_proj_weight, attn.parametrizations.in_proj_weight.original
        width = attn.embed_dim
        assert torch.equal(weight[:width], base[:width]) and torch.equal(
            weight[2 * width :], base[2 * width :]
        )
        assert not torch.equal(weight[width : 2 * width], base[width : 2 * width])


def test_the_frozen_backward_reaches_every_block_and_computes_no_weight_gradient(model, batch):
    images, targets, tokens = batch
    copy, params = reference.prepare(model, "frozen_backward")
    assert params == [] and [n for n, p in copy.named_parameters() if p.requires_grad] == [
        "visual.class_embedding"
    ]
    reached = []
    for block in copy.visual.transformer.resblocks:
        block.register_full_backward_hook(lambda module, grad_in, grad_out: reached.append(module))
    reference.loss_pass(copy, images, targets, tokens, "fp32", text_trains=False)().backward()
    assert len(reached) == BLOCKS
    assert copy.visual.class_embedding.grad.abs().sum() > 0
    assert all(p.grad is None for n, p in copy.named_parameters() if n != "visual.class_embedding")


def test_counted_ops_are_the_dispatched_aten_operators():
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    counts = reference.count_aten_ops(lambda: torch.relu(a @ b))
    assert counts == {"aten.mm": 1, "aten.relu": 1}


def test_step_op_counts_are_positive_and_the_same_every_time(model, batch):
    images, targets, tokens = batch
    lora = TrainableSet("lora_kv", ("visual", "text"), rank=4)
    first = reference.step_ops(model, lora, images, targets, tokens, "fp32")
    assert sum(first.values()) > 0 and first["aten.mm"] > 0
    assert reference.step_ops(model, lora, images, targets, tokens, "fp32") == first
    # training the text tower too costs ops; a forward alone costs fewer than any step
    visual_only = reference.step_ops(
        model, TrainableSet("lora_kv", ("visual",), rank=4), images, targets, tokens, "fp32"
    )
    forward = reference.step_ops(model, TrainableSet(), images, targets, tokens, "fp32")
    assert sum(forward.values()) < sum(visual_only.values()) < sum(first.values())


@pytest.mark.parametrize(
    "trainable",
    [
        TrainableSet("lora_kv", ("visual", "text"), rank=4),
        TrainableSet("mlp_adapter", ("visual",), bottleneck=8),
        TrainableSet("mlp_adapter", ("visual",), bottleneck=8, experts=2, top_k=1),
        TrainableSet("full_visual", ("visual",)),
        TrainableSet(),
    ],
    ids=lambda t: t.kind,
)
def test_every_reference_step_runs_and_reports_images_per_second(model, batch, trainable):
    images, targets, tokens = batch
    measured = reference.measure_steps(model, trainable, images, targets, tokens, "fp32", warmup=1, steps=1)
    assert measured["step_kind"] == trainable.kind
    for name in ("step", "full_step", "frozen_backward"):
        assert measured[f"{name}_images_per_second"] > 0


def test_a_lora_step_moves_the_lora_weights_and_nothing_else(model, batch):
    images, targets, tokens = batch
    copy, params = reference.prepare(model, "step", TrainableSet("lora_kv", ("visual",), rank=2))
    frozen = {n: p.clone() for n, p in copy.named_parameters() if not p.requires_grad}
    before = [p.clone() for p in params]
    step = reference.training_step(copy, params, images, targets, tokens, "fp32", lr=1e-2)
    step()
    step()  # B leaves zero in the first step; A moves in the second
    assert all(not torch.equal(p, q) for p, q in zip(params, before))
    assert all(torch.equal(p, frozen[n]) for n, p in copy.named_parameters() if n in frozen)


def test_a_bad_trainable_set_is_refused():
    with pytest.raises(ValueError, match="kind must be one of"):
        TrainableSet("prompts")
    with pytest.raises(ValueError, match="rank or bottleneck"):
        TrainableSet("lora_kv", ("visual",))


def test_a_mixture_reference_gates_its_experts_by_the_noisy_top_k_of_token_0():
    """The mixture's router (the same trainable set as MOE4CL's): with zero weights every expert
    gets 1/k of the top k; a router that prefers expert 1 gives it the whole output at k = 1."""
    torch.manual_seed(0)
    mixture = reference.MixtureAdapter(width=6, experts=3, bottleneck=4, top_k=1).eval()
    with torch.no_grad():
        for expert in mixture.experts:
            torch.nn.init.normal_(expert.up.weight)
        mixture.w_gate[:, 1] = 1.0
    x = torch.rand(2, 5, 6) + 0.1  # token 0 positive: x0 @ w_gate favours expert 1
    assert torch.equal(mixture(x), mixture.experts[1](x))
    assert len(list(mixture.parameters())) == 3 * 4 + 2
    even = reference.MixtureAdapter(width=6, experts=2, bottleneck=4, top_k=2).eval()
    with torch.no_grad():
        for expert in even.experts:
            torch.nn.init.normal_(expert.up.weight)
    torch.testing.assert_close(even(x), 0.5 * even.experts[0](x) + 0.5 * even.experts[1](x))
