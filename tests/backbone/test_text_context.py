"""``CLIPBackbone.text_context``: learnable token embeddings in the prompts (CoOp), through the
suite's text path. A context equal to the words it replaces gives the same features as the
prompts themselves, on the compact path (length buckets, shared prefix) and the plain one; a
context per prompt follows its prompt through the buckets; gradients reach the context."""

import pytest
import torch

from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip

NAMES = ["cat", "sea lion", "maple tree", "aquarium fish", "x"]  # token counts 1-2: several buckets


@pytest.fixture(scope="module")
def backbone():
    return create_clip(BackboneSpec(TINY_MODEL, "synthetic"))


@pytest.mark.parametrize("compact", [True, False])
def test_a_context_of_the_templates_words_gives_the_prompts_features(backbone, compact):
    tokens = backbone.tokenize([f"a photo of a {name}." for name in NAMES])
    prompts = backbone.prepare_prompts(tokens, compact=compact)
    plain = backbone.encode_text(prompts)
    with backbone.text_context(backbone.word_embeddings("a photo of a"), start=1):
        with_context = backbone.encode_text(prompts)
    assert len(prompts.buckets) == (2 if compact else 1)  # names of one and of two tokens
    torch.testing.assert_close(with_context, plain, rtol=0, atol=1e-6)
    assert backbone.active_text_context is None  # only within the block


def test_a_context_changes_the_features_and_takes_gradients(backbone):
    prompts = backbone.prepare_prompts(backbone.tokenize([f"a photo of a {n}." for n in NAMES]))
    context = torch.nn.Parameter(backbone.word_embeddings("a photo of a") + 0.05 * torch.randn(4, 64))
    with backbone.text_context(context):
        features = backbone.encode_text(prompts)
    assert not torch.allclose(features, backbone.encode_text(prompts), atol=1e-3)
    features.sum().backward()
    assert context.grad is not None and context.grad.abs().sum() > 0


def test_a_context_per_prompt_follows_its_prompt_through_the_buckets(backbone):
    """Row i of an [N, M, D] context goes with prompt i, whichever bucket the prompt lands in: each
    prompt's features equal those of the prompt encoded alone with its own row."""
    tokens = backbone.tokenize([f"a photo of a {n}." for n in NAMES])
    per_prompt = backbone.word_embeddings("a photo of a").repeat(len(NAMES), 1, 1)
    per_prompt = per_prompt + 0.05 * torch.randn_like(per_prompt)
    prompts = backbone.prepare_prompts(tokens, compact=True)
    with backbone.text_context(per_prompt):
        together = backbone.encode_text(prompts)
    for i in range(len(NAMES)):
        with backbone.text_context(per_prompt[i]):
            alone = backbone.encode_text(tokens[i : i + 1])
        torch.testing.assert_close(together[i : i + 1], alone, rtol=0, atol=1e-5)


def test_a_context_outside_the_prompt_or_of_the_wrong_shape_is_refused(backbone):
    tokens = backbone.tokenize(["a cat."])  # <sot> a cat . <eot>: three word positions
    with pytest.raises(ValueError, match="between the start-of-text token"):
        with backbone.text_context(torch.zeros(4, 64)):
            backbone.encode_text(tokens)
    with pytest.raises(ValueError, match=r"\[M, 64\]"):
        with backbone.text_context(torch.zeros(4, 32)):
            pass
    with pytest.raises(RuntimeError, match="do not nest"):
        with backbone.text_context(torch.zeros(1, 64)), backbone.text_context(torch.zeros(1, 64)):
            pass
    assert backbone.active_text_context is None
