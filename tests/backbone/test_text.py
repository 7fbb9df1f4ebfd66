"""The text tower's length buckets (``benchmarks.backbone.text``): the same features and gradients
as the padded 77-token forward, and used only where they pay (``budgets.use_compact_text``)."""

import torch

from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip, use_compact_text


def test_length_buckets_equal_the_padded_encoding_in_fp32_with_gradients():
    torch.manual_seed(0)
    backbone = create_clip(BackboneSpec(TINY_MODEL, "synthetic"))
    backbone.add_lora("text", tower="text", rank=4, alpha=4.0)
    with torch.no_grad():
        for param in backbone.lora_parameters("text"):
            param.normal_(std=0.2)
    backbone.set_adapters(visual=None, text="text")
    backbone.set_trainable(["text"])
    names = ["cat", "red striped triangle", "dog", "a very large and rather fluffy orange dog", "x", "lynx"]
    tokens = backbone.tokenize([f"a photo of a {n}." for n in names])
    bucketed = backbone.prepare_prompts(tokens, compact=True)
    padded = backbone.prepare_prompts(tokens, compact=False)
    assert len(backbone.prepare_prompts(tokens).buckets) == 1  # 6 short prompts: compact would not pay
    # one token each ("cat", "dog", "x", "lynx"), three ("red striped triangle"), eight (the long dog)
    assert len(bucketed.buckets) == 3 and len(padded.buckets) == 1
    features, grads = [], []
    for prompts in (bucketed, padded):
        backbone.zero_grad(set_to_none=True)
        out = backbone.encode_text(prompts)
        (out * torch.linspace(-1, 1, out.shape[1])).sum().backward()
        features.append(out.detach())
        grads.append(torch.cat([p.grad.flatten() for p in backbone.lora_parameters("text")]))
    assert (features[0] - features[1]).abs().max() <= 1e-6
    assert (grads[0] - grads[1]).abs().max() <= 1e-6 * grads[1].abs().max()
    with torch.no_grad():  # and both equal open_clip's own 77-token forward
        torch.testing.assert_close(
            features[0], backbone.model.encode_text(tokens, normalize=True), atol=1e-6, rtol=0
        )


def test_compact_text_only_where_it_pays():
    # 2 CPU cores: 1000 ImageNet prompts (about 24 tokens) pay off for both text widths, and 100
    # for ViT-B/16's; a 100-prompt tiny-CLIP step does not; a GPU is launch-bound at every size seen.
    assert use_compact_text(1000, 24, 512, "cpu") and use_compact_text(1000, 24, 64, "cpu")
    assert use_compact_text(100, 20, 512, "cpu") and not use_compact_text(100, 20, 64, "cpu")
    assert not use_compact_text(10**6, 77, 1024, "cuda")
