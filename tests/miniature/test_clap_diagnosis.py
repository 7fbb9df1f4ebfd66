"""The CLAP diagnosis of docs/miniature.md: before training, CLAP with its two added terms at zero
scores exactly as zero-shot CLIP on the same images; with them, the VGA's post-norm output has norm
sqrt(d) against t_c's 1, which is why untrained CLAP already differs from zero-shot."""

import math

import pytest
import torch

from benchmarks.miniature.clap_diagnosis import accuracy, before_training, build, untrained

pytestmark = pytest.mark.slow  # the miniature world's 2,000 test images through the tiny CLIP


@pytest.fixture(scope="module")
def built():
    return build(seed=0, epochs=None)


def test_clap_with_its_added_terms_at_zero_scores_as_zero_shot(built):
    clap, stream, features, targets = built
    classes = [c for task in stream.tasks for c in task]
    zero_shot = clap.backbone.logit_scale * features @ clap.class_text(classes).T
    fresh = untrained(clap, stream.tasks)
    fresh.vga.forward = lambda queries, memory, tgt_mask=None: torch.zeros_like(queries)
    with torch.no_grad():
        for encoder in fresh.encoders:  # mu = 0; sigma = softplus(-30) * 0.999 + 0.001 ~ 0.001
            encoder.mu.weight.zero_(), encoder.mu.bias.zero_()
            encoder.sigma.weight.zero_(), encoder.sigma.bias.fill_(-30.0)
        scores = fresh.scores_from_features(features)
    # z's residual 0.001 * N(0, 1) per dimension, averaged over R samples, moves a logit by < 1
    assert torch.allclose(scores, zero_shot, atol=1.0)
    assert accuracy(scores, classes, targets) == pytest.approx(accuracy(zero_shot, classes, targets), abs=0.5)


def test_untrained_clap_adds_a_term_of_norm_sqrt_d_and_loses_accuracy(built):
    out = before_training(*built)
    width = built[0].backbone.embed_dim
    assert out["|t_c|"] == pytest.approx(1.0, abs=1e-5)
    assert out["|VGA_c|"] == pytest.approx(math.sqrt(width), rel=1e-3)  # a LayerNorm's output, unit scale
    assert out["CLAP untrained"] < out["zero-shot"]
