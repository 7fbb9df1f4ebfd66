"""Tests of benchmarks.backbone: weights resolution, attention surgery, text trimming, LoRA adapters."""

from __future__ import annotations

import copy
import math
import socket
import time
from collections.abc import Iterator

import open_clip
import pytest
import torch
from safetensors.torch import load_file, save_file

from benchmarks.backbone import (
    DEFAULT_MODEL,
    TINY_MODEL,
    BackboneSpec,
    CLIPBackbone,
    SplitAttention,
    create_clip,
    efficient_images_per_forward,
    fuse_attention_,
    shared_prefix_length,
    split_attention_,
)
from benchmarks.core.errors import UserError, WeightsNotFoundError

PROMPTS = ["a photo of a cat.", "a photo of a very large and rather fluffy orange dog.", "x"]
# Prompts of one template: they share "<sot> a photo of a", which the text encoder runs only once.
TEMPLATED = [
    "a photo of a cat.",
    "a photo of a red striped triangle.",
    "a photo of a dog.",
    "a photo of a lynx.",
]


def _randomize(backbone: CLIPBackbone, name: str, seed: int) -> None:
    """Give adapter ``name`` non-zero A and B so that it changes the features."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in backbone.lora_parameters(name):
            param.copy_(torch.randn(param.shape, generator=generator) * 0.2)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


@pytest.fixture(autouse=True, scope="module")
def _single_thread() -> Iterator[None]:
    # These tensors are tiny: intra-op threads only add synchronisation, which costs 10-100x on a
    # busy 2-core machine. Restored afterwards for the other test modules.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _split_backbone(reference: torch.nn.Module, model_name: str) -> CLIPBackbone:
    """A backbone around a copy of an unmodified open_clip model, attention split."""
    model = copy.deepcopy(reference)
    split_attention_(model)
    return CLIPBackbone(model, open_clip.get_tokenizer(model_name))


@pytest.fixture
def tiny() -> CLIPBackbone:
    torch.manual_seed(0)
    return create_clip(BackboneSpec(TINY_MODEL, pretrained=None))


@pytest.fixture(scope="module")
def tiny_reference() -> torch.nn.Module:
    """An unmodified open_clip tiny model (fused attention)."""
    torch.manual_seed(1)
    return open_clip.create_model(TINY_MODEL).eval()


@pytest.fixture
def images() -> torch.Tensor:
    return torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(2))


# --------------------------------------------------------------------------- creation and weights


def test_tiny_model_is_small_and_configured(tiny: CLIPBackbone) -> None:
    n_params = sum(p.numel() for p in tiny.parameters())
    assert 1_000_000 < n_params <= 5_000_000
    assert (tiny.image_size, tiny.embed_dim) == (
        32,
        256,
    )  # the joint embedding is wider than the text tower (docs/miniature.md)
    assert tiny.mean == pytest.approx((0.48145466, 0.4578275, 0.40821073))
    assert tiny.logit_scale == pytest.approx(1 / 0.07, rel=1e-5)
    assert not any(p.requires_grad for p in tiny.parameters())
    attns = [
        block.attn for t in (tiny.model.visual.transformer, tiny.model.transformer) for block in t.resblocks
    ]
    assert len(attns) == 8 and all(isinstance(a, SplitAttention) for a in attns)
    tokens = tiny.tokenize(PROMPTS)
    assert tokens.dtype == torch.long and tokens.shape == (3, 77)


def test_unknown_model_name_is_a_user_error() -> None:
    with pytest.raises(UserError, match="list_models"):
        create_clip(BackboneSpec("ViT-B16", pretrained=None))


def test_missing_tag_fails_fast_without_network(tmp_path, monkeypatch) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    start = time.perf_counter()
    with pytest.raises(WeightsNotFoundError) as info:
        create_clip(BackboneSpec(DEFAULT_MODEL, pretrained="openai", cache_dir=str(tmp_path)))
    assert time.perf_counter() - start < 3.0
    message = str(info.value)
    assert "\n" not in message
    assert str(tmp_path) in message and "--weights" in message and "ViT-B-16.pt" in message


def test_unknown_tag_is_reported() -> None:
    with pytest.raises(WeightsNotFoundError, match="openai"):
        create_clip(BackboneSpec(DEFAULT_MODEL, pretrained="no-such-tag"))


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["safetensors", "torch", "torchscript"])
def test_checkpoint_file_loads_to_identical_outputs(fmt, tmp_path, tiny_reference, images) -> None:
    path = tmp_path / f"tiny.{'safetensors' if fmt == 'safetensors' else 'pt'}"
    state = tiny_reference.state_dict()
    if fmt == "safetensors":
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    elif fmt == "torch":
        torch.save(state, path)
    else:  # the original OpenAI checkpoints are TorchScript archives
        with pytest.warns(FutureWarning):
            torch.jit.save(torch.jit.script(copy.deepcopy(tiny_reference)), str(path))

    backbone = create_clip(BackboneSpec(TINY_MODEL, pretrained=str(path)))
    expected = _split_backbone(tiny_reference, TINY_MODEL)  # same weights, same (split) forward
    tokens = backbone.tokenize(PROMPTS)
    with torch.no_grad():
        assert torch.equal(backbone.encode_image(images), expected.encode_image(images))
        assert torch.equal(backbone.encode_text(tokens), expected.encode_text(tokens))


def test_unreadable_checkpoint_is_a_user_error(tmp_path) -> None:
    path = tmp_path / "broken.pt"
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="broken.pt"):
        create_clip(BackboneSpec(TINY_MODEL, pretrained=str(path)))


# --------------------------------------------------------------------------- attention surgery and trimming


def _check_surgery(
    reference: torch.nn.Module, images: torch.Tensor, model_name: str, in_place: bool = False
) -> tuple[float, float]:
    """Split ``reference`` (or a copy); return max |diff| of image and text features vs the fused model."""
    tokens = open_clip.get_tokenizer(model_name)(PROMPTS + TEMPLATED)
    templated = tokens[len(PROMPTS) :]
    with torch.no_grad():
        image_ref = reference.encode_image(images, normalize=True)
        text_ref = reference.encode_text(tokens, normalize=True)
    if in_place:
        split_attention_(reference)
        backbone = CLIPBackbone(reference, open_clip.get_tokenizer(model_name))
    else:
        backbone = _split_backbone(reference, model_name)
    with torch.no_grad():
        image_diff = _max_diff(backbone.encode_image(images), image_ref)
        # Untrimmed open_clip forward through the split blocks, and the trimmed backbone forward.
        text_diff = max(
            _max_diff(backbone.model.encode_text(tokens, normalize=True), text_ref),
            _max_diff(backbone.encode_text(tokens), text_ref),
            _max_diff(backbone.encode_text(templated), text_ref[len(PROMPTS) :]),  # shared prefix
        )
    print(f"{model_name}: max |diff| image {image_diff:.2e}, text {text_diff:.2e}")
    return image_diff, text_diff


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("mask_kind", [None, "float", "bool", "per_head"])
def test_split_attention_module_matches_multihead_attention(batch_first, mask_kind) -> None:
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(32, 4, batch_first=batch_first).eval()
    with torch.no_grad():
        mha.in_proj_bias.normal_()
        mha.out_proj.bias.normal_()
    split = SplitAttention(mha)
    batch, length = 3, 6
    x = torch.randn((batch, length, 32) if batch_first else (length, batch, 32))
    blocked = torch.ones(length, length, dtype=torch.bool).triu(1)  # MultiheadAttention: True = blocked
    masks = {
        None: None,
        "float": torch.zeros(length, length).masked_fill(blocked, float("-inf")),
        "bool": blocked,
        "per_head": torch.randn(batch * 4, length, length),
    }
    with torch.no_grad():
        expected = mha(x, x, x, need_weights=False, attn_mask=masks[mask_kind])[0]
        actual, weights = split(x, x, x, need_weights=False, attn_mask=masks[mask_kind])
    assert weights is None
    assert _max_diff(actual, expected) < 1e-5


def test_split_attention_matches_fused_tiny(tiny_reference, images) -> None:
    image_diff, text_diff = _check_surgery(tiny_reference, images, TINY_MODEL)
    assert image_diff < 1e-5 and text_diff < 1e-5


def test_fusing_the_split_attention_gives_back_open_clips_model(tiny_reference, images) -> None:
    # Code written against open_clip's layout (C3Box's) reads `attn.in_proj_weight` keys and counts
    # nn.MultiheadAttention modules: the fused copy must be open_clip's model again, key for key.
    model = copy.deepcopy(tiny_reference).train()
    split_attention_(model)
    fuse_attention_(model)
    assert not any(isinstance(m, SplitAttention) for m in model.modules())
    expected, actual = tiny_reference.state_dict(), model.state_dict()
    assert list(actual) == list(expected)
    assert all(torch.equal(actual[k], expected[k]) for k in expected)
    attns = [m for m in model.modules() if isinstance(m, torch.nn.MultiheadAttention)]
    assert len(attns) == 8 and all(a.training and a.batch_first == attns[0].batch_first for a in attns)
    model.eval()
    with torch.no_grad():
        assert torch.equal(model.encode_image(images), tiny_reference.encode_image(images))


def test_an_attention_with_lora_has_no_fused_form(tiny: CLIPBackbone) -> None:
    tiny.add_lora("vis", "visual")
    with pytest.raises(ValueError, match="no fused form"):
        fuse_attention_(tiny.model)


@pytest.mark.slow
def test_split_attention_matches_fused_vit_b16() -> None:
    # Built here rather than in a fixture: the only user, and splitting in place saves a 600 MB copy.
    torch.manual_seed(3)
    reference = open_clip.create_model(DEFAULT_MODEL).eval()
    images = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(4))
    image_diff, text_diff = _check_surgery(reference, images, DEFAULT_MODEL, in_place=True)
    assert image_diff < 1e-5 and text_diff < 1e-5


def test_text_trimming_is_exact_with_an_adapter(tiny: CLIPBackbone) -> None:
    tiny.add_lora("text", "text")
    _randomize(tiny, "text", seed=5)
    tiny.set_adapters(visual=None, text="text")
    tokens = tiny.tokenize(PROMPTS)
    with torch.no_grad():
        full = tiny.model.encode_text(tokens, normalize=True)  # all 77 positions
        assert _max_diff(tiny.encode_text(tokens), full) < 1e-6
        assert _max_diff(tiny.encode_text(tokens[:1]), full[:1]) < 1e-6  # shortest prompt alone


def test_shared_prefix_length_by_hand() -> None:
    # EOT is the largest id in each row (open_clip's convention); 0 is padding.
    tokens = torch.tensor([[1, 5, 6, 9, 0], [1, 5, 6, 7, 9], [1, 5, 8, 9, 0]])
    assert shared_prefix_length(tokens, tokens.argmax(-1)) == 2
    assert shared_prefix_length(tokens[:2], tokens[:2].argmax(-1)) == 3
    assert shared_prefix_length(tokens[:1], tokens[:1].argmax(-1)) == 0  # one row: nothing to share
    same = torch.tensor([[1, 5, 9, 0], [1, 5, 9, 0]])
    assert shared_prefix_length(same, same.argmax(-1)) == 2  # identical rows: EOT stays outside


def test_shared_prefix_gives_the_full_forward_and_its_gradients(tiny: CLIPBackbone) -> None:
    tiny.add_lora("text", "text")
    _randomize(tiny, "text", seed=6)
    tiny.set_adapters(visual=None, text="text")
    tiny.set_trainable(["text"])
    tokens = tiny.tokenize(TEMPLATED)
    assert shared_prefix_length(tokens, tokens.argmax(-1)) == 5  # <sot> a photo of a
    target = torch.randn(len(TEMPLATED), tiny.embed_dim, generator=torch.Generator().manual_seed(7))

    def features_and_grads(encode):
        tiny.zero_grad(set_to_none=True)
        features = encode(tokens)
        (features * target).sum().backward()
        return features.detach(), [p.grad.clone() for p in tiny.lora_parameters("text")]

    shared, shared_grads = features_and_grads(tiny.encode_text)
    full, full_grads = features_and_grads(
        lambda t: tiny.model.encode_text(t, normalize=True)
    )  # all 77 positions
    assert _max_diff(shared, full) < 1e-6
    assert all(
        _max_diff(a, b) < 1e-5 * max(1.0, b.abs().max().item()) for a, b in zip(shared_grads, full_grads)
    )
    assert any(g.abs().sum() > 0 for g in shared_grads)


# --------------------------------------------------------------------------- LoRA adapters


def test_new_adapters_are_identity_and_towers_independent(tiny: CLIPBackbone, images) -> None:
    tokens = tiny.tokenize(PROMPTS)
    with torch.no_grad():
        base_image, base_text = tiny.encode_image(images), tiny.encode_text(tokens)
        tiny.add_lora("vis", "visual")
        tiny.add_lora("txt", "text")
        tiny.set_adapters(visual="vis", text="txt")
        assert tiny.model.visual.transformer.resblocks[0].attn.k_proj.scaling["vis"] == pytest.approx(1 / 24)
        assert torch.equal(tiny.encode_image(images), base_image)
        assert torch.equal(tiny.encode_text(tokens), base_text)

        _randomize(tiny, "txt", seed=6)
        assert torch.equal(tiny.encode_image(images), base_image)
        assert _max_diff(tiny.encode_text(tokens), base_text) > 1e-3

        _randomize(tiny, "vis", seed=7)
        tiny.set_adapters(visual="vis", text=None)
        assert torch.equal(tiny.encode_text(tokens), base_text)
        assert _max_diff(tiny.encode_image(images), base_image) > 1e-3
    assert tiny.adapter_names("visual") == ["vis"] and tiny.adapter_names("text") == ["txt"]
    with pytest.raises(ValueError, match="tower"):
        tiny.set_adapters(visual="txt", text=None)


def test_lora_a_initialisations_follow_their_bounds_and_keep_the_identity(tiny: CLIPBackbone, images) -> None:
    """A is kaiming-uniform (a = sqrt 5, peft's default) or xavier-uniform; B = 0 either way."""
    with torch.no_grad():
        base = tiny.encode_image(images)
        torch.manual_seed(0)
        tiny.add_lora("kaiming", "visual", rank=4)
        tiny.add_lora("xavier", "visual", rank=4, init_a="xavier")
        layer = tiny.model.visual.transformer.resblocks[0].attn.k_proj
        width = layer.in_features
        for name, bound in (("kaiming", 1 / math.sqrt(width)), ("xavier", math.sqrt(6 / (width + 4)))):
            a, b = layer.lora_A[name].weight, layer.lora_B[name].weight
            assert a.abs().max() <= bound and a.abs().max() > 0.9 * bound, name  # uniform(-bound, bound)
            assert a.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.1), name
            assert not b.any(), name
            tiny.set_adapters(visual=name, text=None)
            assert torch.equal(tiny.encode_image(images), base), name
    with pytest.raises(ValueError, match="init_a"):
        tiny.add_lora("orthogonal", "visual", init_a="orthogonal")


def test_set_trainable_owns_requires_grad_and_optimizer_touches_only_it(tiny: CLIPBackbone, images) -> None:
    for name in ("v1", "v2"):
        tiny.add_lora(name, "visual")
    tiny.add_lora("t", "text")
    tiny.set_trainable(["v1"])
    trainable = {id(p) for p in tiny.lora_parameters("v1")}
    assert {id(p) for p in tiny.parameters() if p.requires_grad} == trainable
    tiny.set_adapters(visual="v2", text="t")  # switching must not change trainability
    assert {id(p) for p in tiny.parameters() if p.requires_grad} == trainable

    tiny.set_adapters(visual="v1", text="t")
    before = {name: p.detach().clone() for name, p in tiny.named_parameters()}
    optimizer = torch.optim.SGD([p for p in tiny.parameters() if p.requires_grad], lr=1.0)
    text = tiny.encode_text(tiny.tokenize(PROMPTS))
    loss = -(tiny.encode_image(images) @ text.T).logsumexp(dim=1).mean()
    loss.backward()
    optimizer.step()
    changed = {name for name, p in tiny.named_parameters() if not torch.equal(p, before[name])}
    assert changed and all(
        ".v1." in name and "lora_B" in name for name in changed
    )  # A gets no grad while B = 0


def test_copy_lora_and_safetensors_round_trip(tiny: CLIPBackbone, images, tmp_path) -> None:
    for name in ("src", "dst", "loaded"):
        tiny.add_lora(name, "visual")
    tiny.add_lora("t", "text")
    _randomize(tiny, "src", seed=8)

    def features(adapter: str) -> torch.Tensor:
        tiny.set_adapters(visual=adapter, text=None)
        with torch.no_grad():
            return tiny.encode_image(images)

    tiny.copy_lora("src", "dst")
    assert torch.equal(features("dst"), features("src"))
    with pytest.raises(ValueError, match="tower"):
        tiny.copy_lora("src", "t")

    state = tiny.lora_state_dict("src")
    assert "visual.transformer.resblocks.0.attn.k_proj.lora_A" in state
    assert len(state) == 4 * 2 * 2  # blocks x (k, v) x (A, B)
    save_file(state, str(tmp_path / "lora.safetensors"))
    tiny.load_lora_state_dict("loaded", load_file(str(tmp_path / "lora.safetensors")))
    assert torch.equal(features("loaded"), features("src"))
    with pytest.raises(UserError):
        tiny.load_lora_state_dict("t", state)


def test_backbones_share_one_tokenizer_and_a_copy_shares_nothing_else(tiny: CLIPBackbone, images) -> None:
    """Every backbone of a model, and every deep copy of one (a plugin's, another framework's
    network), holds the same tokenizer object, which tokenizes as open_clip's own; the weights and
    adapters of a copy are its own."""
    other = create_clip(BackboneSpec(TINY_MODEL, pretrained=None))
    assert other.tokenizer is tiny.tokenizer
    assert torch.equal(tiny.tokenize(PROMPTS), open_clip.get_tokenizer(TINY_MODEL)(PROMPTS))
    tiny.add_lora("a", "visual")
    _randomize(tiny, "a", seed=3)
    tiny.set_adapters(visual="a", text=None)
    copied = copy.deepcopy(tiny)
    assert copied.tokenizer is tiny.tokenizer
    pairs = list(zip(tiny.parameters(), copied.parameters(), strict=True))
    assert all(torch.equal(p, q) and p.data_ptr() != q.data_ptr() for p, q in pairs)
    with torch.no_grad():
        before = tiny.encode_image(images)
        assert torch.equal(copied.encode_image(images), before)
        for param in copied.lora_parameters("a"):
            param.add_(1.0)
        assert torch.equal(tiny.encode_image(images), before)  # the original's adapter is untouched
        assert not torch.equal(copied.encode_image(images), before)
    copied.add_lora("b", "text")  # adapters added to the copy are the copy's alone
    assert "b" in copied._towers and "b" not in tiny._towers


def test_encode_image_multi_matches_single_adapter_forwards(tiny: CLIPBackbone, images) -> None:
    names = ["a", "b", "c"]
    for seed, name in enumerate(names):
        tiny.add_lora(name, "visual")
        _randomize(tiny, name, seed=10 + seed)
    tiny.add_lora("t", "text")
    tiny.set_adapters(visual="b", text="t")
    adapters: list[str | None] = [*names, None]
    with torch.no_grad():
        multi = tiny.encode_image_multi(images, adapters)
    assert multi.shape == (len(adapters), len(images), tiny.embed_dim)
    assert tiny.active_adapters == {"visual": "b", "text": "t"}  # untouched by the mixed batch

    for i, name in enumerate(adapters):
        tiny.set_adapters(visual=name, text=None)
        with torch.no_grad():
            single = tiny.encode_image(images)
        assert _max_diff(multi[i], single) < 1e-5
    assert _max_diff(multi[0], multi[1]) > 1e-3  # the adapters really differ
    # capped forwards: 2 adapters per forward (then 2), and 1 when the cap is below one batch
    tiny.set_adapters(visual="b", text="t")
    for cap in (2 * len(images) + 1, 1):
        with torch.no_grad():
            grouped = tiny.encode_image_multi(images, adapters, max_images_per_forward=cap)
        assert _max_diff(grouped, multi) < 1e-5
        assert tiny.active_adapters == {
            "visual": "b",
            "text": "t",
        }  # a branch alone ran plainly, then restored


def test_efficient_images_per_forward_by_hand(tiny: CLIPBackbone) -> None:
    # ViT-B/16 at 224 px: 14 x 14 patches + class token = 197 tokens of width 768
    assert efficient_images_per_forward(197, 768, "cpu") == 2**19 // (197 * 768) == 3
    assert efficient_images_per_forward(197, 768, "cuda") == 2**26 // (197 * 768) == 443
    assert efficient_images_per_forward(10**6, 768, "cpu") == 1  # never below one image
    # tiny-clip-32: 32 px in patches of 8 -> 4 x 4 + 1 = 17 tokens of width 128
    assert tiny.efficient_images_per_forward() == 2**19 // (17 * 128) == 240
