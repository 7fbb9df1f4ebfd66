"""MOE4CL and the parallel MLP adapters it uses: identity at initialisation, gates, SOT routing,
text features against a hand-written block-by-block forward, the parameter counts of docs/baselines.md
section 6, and exact save/load and resume."""

import pytest
import torch

from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
from benchmarks.backbone.mlp_adapters import mlp_adapter_parameter_count, noisy_top_k_gates
from strategies.methods.moe4cl import MOE4CL
from strategies.settings import RunSettings
from tests.helpers import killed_and_resumed, run_one_run_suite, strategy_from_suite, three_task_suite

SUITE = three_task_suite(
    "moe4cl",
    "epochs = 2\nbatch_size = 16\neval_batch_size = 100\nlr = 0.01\nwarmup_steps = 2",
    augmentation="rrc90",
)
PROMPTS = ["a bad photo of a cat.", "a bad photo of a small red boat.", "a bad photo of a dog."]


def _backbone_with_experts(nonzero: bool = True):
    torch.manual_seed(0)
    backbone = create_clip(BackboneSpec(TINY_MODEL, "synthetic"))
    tokens, images = backbone.tokenize(PROMPTS), torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        plain = backbone.encode_text(tokens), backbone.encode_image(images)
    for tower in ("visual", "text"):
        backbone.add_mlp_adapters(tower, experts=2, bottleneck=8, router=True)
    if nonzero:  # as after training: every weight, routers included, away from its initialisation
        with torch.no_grad():
            for p in backbone.mlp_adapter_parameters():
                p.normal_(0, 0.2)
    return backbone, tokens, images, plain


def test_noisy_top_k_gates_by_hand():
    x0, w_gate, w_noise = (
        torch.tensor([[1.0, 2.0]]),
        torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5]]),
        torch.zeros(2, 3),
    )
    logits = torch.tensor([1.0, 2.0, 1.5])  # x0 W_g
    assert torch.allclose(noisy_top_k_gates(x0, w_gate, w_noise, 3, None)[0], logits.softmax(0))
    top2 = torch.tensor([0.0, 2.0, 1.5]).exp() * torch.tensor([0.0, 1.0, 1.0])
    assert torch.allclose(noisy_top_k_gates(x0, w_gate, w_noise, 2, None)[0], top2 / top2.sum())
    noise = torch.tensor([[1.0, -1.0, 0.0]])  # softplus(0) + 0.01 scales the noise
    scale = torch.nn.functional.softplus(torch.zeros(())) + 0.01
    assert torch.allclose(
        noisy_top_k_gates(x0, w_gate, w_noise, 3, noise)[0], (logits + noise[0] * scale).softmax(0)
    )


def test_new_experts_leave_clip_bit_identical_in_train_and_eval_mode():
    backbone, tokens, images, (text, image) = _backbone_with_experts(nonzero=False)
    for train in (False, True):  # train mode: dropout and gate noise, still exactly 0 added
        backbone.train(train)
        with torch.no_grad():
            assert torch.equal(backbone.encode_text(tokens), text)
            assert torch.equal(backbone.encode_image(images), image)


def test_gates_are_a_distribution_over_both_experts_and_sot_routing_is_prompt_independent():
    backbone, tokens, images, (text, image) = _backbone_with_experts()
    backbone.eval()
    with torch.no_grad():
        first = backbone.encode_image(images)
        assert torch.equal(backbone.encode_image(images), first)  # no noise at evaluation: deterministic
        assert not torch.allclose(first, image)
        backbone.encode_text(tokens)
    for tower in ("visual", "text"):
        for adapter in backbone.mlp_adapter_modules[tower]:
            gates = adapter.last_gates
            assert (gates > 0).all() and torch.allclose(gates.sum(-1), torch.ones(len(gates)))
    text_gates = [adapter.last_gates for adapter in backbone.mlp_adapter_modules["text"]]
    assert all(torch.equal(g, g[:1].expand_as(g)) for g in text_gates)  # SOT: the same for every prompt
    backbone.set_gate_noise_at_eval(True)
    with torch.no_grad():
        assert not torch.equal(backbone.encode_image(images), first)  # the official noisy evaluation


def test_text_with_experts_equals_a_plain_block_by_block_forward():
    backbone, tokens, images, (text, image) = _backbone_with_experts()
    backbone.eval()
    model = backbone.model
    with torch.no_grad():
        compact = backbone.encode_text(backbone.prepare_prompts(tokens, compact=True))
        with backbone.mlp_adapters(enabled=False):  # the parts, then the branch added by hand
            x = model.token_embedding(tokens) + model.positional_embedding
            for block, adapter in zip(
                model.transformer.resblocks, backbone.mlp_adapter_modules["text"], strict=True
            ):
                x = x + block.attention(block.ln_1(x), attn_mask=model.attn_mask)
                x = x + block.mlp(block.ln_2(x)) + adapter(x, batch_first=True)
            x = model.ln_final(x[torch.arange(len(x)), tokens.argmax(-1)]) @ model.text_projection
            reference = torch.nn.functional.normalize(x, dim=-1)
            assert torch.equal(backbone.encode_text(tokens), text)  # switched off: plain CLIP
            assert torch.equal(backbone.encode_image(images), image)
    torch.testing.assert_close(compact, reference, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_trainable_parameters_match_the_counts_of_baselines_md(vit_b16):
    torch.manual_seed(0)
    vit = MOE4CL(
        backbone=vit_b16,
        class_names=["a", "b"],
        config=MOE4CL.Config(),
        settings=RunSettings(show_progress=False),
    )
    assert vit.trainable_parameter_count() == 4_027_392
    assert mlp_adapter_parameter_count(768, 12, 2, 64, True) == 2_416_128  # the visual tower
    tiny = MOE4CL(
        backbone=create_clip(BackboneSpec(TINY_MODEL, "synthetic")),
        class_names=["a", "b"],
        config=MOE4CL.Config(),
        settings=RunSettings(show_progress=False),
    )
    assert tiny.trainable_parameter_count() == 202_240
    trainable = {p for p in tiny.backbone.parameters() if p.requires_grad}
    assert trainable == set(tiny.backbone.mlp_adapter_parameters())  # CLIP itself stays frozen


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory):
    return run_one_run_suite(tmp_path_factory.mktemp("moe4cl"), SUITE, "--save-models")


@pytest.mark.slow
def test_run_is_fp32_and_save_load_gives_identical_scores(moe_run):
    suite, results, result = moe_run
    assert result["config"]["precision"] == "fp32" and result["cost"]["trainable_params"] == 202_240
    assert all(s["routing_acc"] >= s["acc"] for s in result["stages"])
    saved = results / "synthetic" / "moe4cl" / "T3-seed0.model"
    first, _, _ = strategy_from_suite(suite)
    second, _, _ = strategy_from_suite(suite)
    untrained, _, _ = strategy_from_suite(suite)
    first.load_model(saved)
    second.load_model(saved)
    untrained.seen_classes = first.seen_classes
    assert len(first.seen_classes) == 15
    images = torch.randn(5, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(first.scores(images), second.scores(images))
        assert not torch.allclose(untrained.scores(images), first.scores(images))  # the experts were restored


@pytest.mark.slow
def test_killed_run_resumes_with_identical_results(moe_run, tmp_path, monkeypatch):
    suite, _, reference = moe_run
    resumed = killed_and_resumed(monkeypatch, MOE4CL, suite, tmp_path, task=2)
    assert resumed["stages"] == reference["stages"]
