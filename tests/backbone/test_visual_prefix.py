"""The visual prefix hook (docs/baselines.md §2.8): prefix keys and values at chosen visual blocks,
per forward and per sample. Equivalence tests on the tiny model."""

import pytest
import torch

from benchmarks.backbone import BackboneSpec, create_clip
from benchmarks.core.errors import UserError


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return create_clip(BackboneSpec("tiny-clip-32", None))


@pytest.fixture(scope="module")
def images(tiny):
    return torch.randn(3, 3, tiny.image_size, tiny.image_size, generator=torch.Generator().manual_seed(1))


def _width(tiny) -> int:
    return tiny.model.visual.transformer.width


def _blocks(tiny):
    return tiny.model.visual.transformer.resblocks


def test_a_zero_length_prefix_leaves_the_features_bit_identical(tiny, images):
    plain = tiny.encode_image(images)
    empty = torch.zeros(len(images), 0, _width(tiny))
    with tiny.visual_prefix({layer: (empty, empty) for layer in range(len(_blocks(tiny)))}):
        prefixed = tiny.encode_image(images)
    assert torch.equal(plain, prefixed)


def test_a_prefix_equal_to_a_tokens_projection_matches_duplicating_that_token(tiny):
    attention = _blocks(tiny)[1].attn
    generator = torch.Generator().manual_seed(2)
    tokens = torch.randn(2, 7, _width(tiny), generator=generator)  # batch first
    j = 4
    with torch.no_grad():
        keys, values = attention.k_proj(tokens[:, j : j + 1]), attention.v_proj(tokens[:, j : j + 1])
        duplicated = torch.cat([tokens[:, j : j + 1], tokens], dim=1)

        def call(x):
            x = x if attention.batch_first else x.transpose(0, 1)
            out = attention(x, x, x, need_weights=False)[0]
            return out if attention.batch_first else out.transpose(0, 1)

        attention.prefix = (keys, values)
        try:
            with_prefix = call(tokens)
        finally:
            attention.prefix = None
        expected = call(duplicated)[:, 1:]  # the original positions
        assert not torch.allclose(with_prefix, call(tokens), atol=1e-4)  # the prefix does matter
    torch.testing.assert_close(with_prefix, expected, atol=1e-6, rtol=1e-6)


def test_gradients_reach_the_prefix_and_never_the_frozen_weights(tiny, images):
    last = len(_blocks(tiny)) - 1
    keys = torch.randn(len(images), 3, _width(tiny), requires_grad=True)
    values = torch.randn(len(images), 3, _width(tiny), requires_grad=True)
    tiny.zero_grad(set_to_none=True)
    with tiny.visual_prefix({0: (keys, values), last: (keys * 0.5, values * 0.5)}):
        tiny.encode_image(images).sum().backward()
    assert keys.grad is not None and keys.grad.abs().sum() > 0
    assert values.grad is not None and values.grad.abs().sum() > 0
    assert all(p.grad is None for p in tiny.parameters())


def test_each_sample_attends_over_its_own_prefix_row(tiny, images):
    generator = torch.Generator().manual_seed(3)
    keys = torch.randn(len(images), 2, _width(tiny), generator=generator)
    values = torch.randn(len(images), 2, _width(tiny), generator=generator)
    with tiny.visual_prefix({2: (keys, values)}):
        batch = tiny.encode_image(images)
    for i in range(len(images)):
        with tiny.visual_prefix({2: (keys[i : i + 1], values[i : i + 1])}):
            alone = tiny.encode_image(images[i : i + 1])
        torch.testing.assert_close(batch[i : i + 1], alone, atol=1e-5, rtol=1e-5)
    with tiny.visual_prefix({2: (keys[:1], values[:1])}):  # one row serves the whole batch
        shared = tiny.encode_image(images)
    assert not torch.allclose(shared[1], batch[1], atol=1e-4)


def test_the_prefix_is_gone_after_the_block_even_after_an_error(tiny, images):
    plain = tiny.encode_image(images)
    keys = torch.randn(1, 2, _width(tiny))
    with pytest.raises(RuntimeError, match="boom"):
        with tiny.visual_prefix({0: (keys, keys)}):
            raise RuntimeError("boom")
    assert all(block.attn.prefix is None for block in _blocks(tiny))
    assert torch.equal(tiny.encode_image(images), plain)


def test_the_text_tower_is_untouched(tiny):
    tokens = tiny.tokenize(["a photo of a cat.", "a photo of a dog."])
    plain = tiny.encode_text(tokens)
    keys = torch.randn(1, 2, _width(tiny))
    with tiny.visual_prefix({0: (keys, keys)}):
        assert torch.equal(tiny.encode_text(tokens), plain)


def test_bad_prefixes_are_refused(tiny):
    depth, keys = len(_blocks(tiny)), torch.randn(1, 2, _width(tiny))
    with pytest.raises(UserError, match=f"visual tower has {depth} blocks"):
        with tiny.visual_prefix({depth: (keys, keys)}):
            pass
    with pytest.raises(ValueError, match="must both be"):
        with tiny.visual_prefix({0: (keys, keys[:, :1])}):
            pass
    with pytest.raises(RuntimeError, match="do not nest"):
        with tiny.visual_prefix({0: (keys, keys)}), tiny.visual_prefix({0: (keys, keys)}):
            pass
    assert all(block.attn.prefix is None for block in _blocks(tiny))


def test_a_prefix_joins_in_the_autocast_dtype(tiny, images):
    keys = torch.randn(len(images), 2, _width(tiny))  # fp32 prefix, bf16 attention
    with torch.autocast("cpu", dtype=torch.bfloat16), tiny.visual_prefix({1: (keys, keys)}):
        features = tiny.model.encode_image(images)
    assert torch.isfinite(features.float()).all()
