"""GR4CIL under mixed precision (bf16 on the CPU): its thresholds and its zero-shot MSPs stay fp32."""

import pytest
import torch

from strategies.methods.gr4cil import GR4CIL
from tests.helpers import tiny_strategy


@pytest.mark.slow
def test_gr4cil_thresholds_and_zero_shot_msps_are_fp32(tiny_stream):
    strategy = tiny_strategy(GR4CIL, tiny_stream, "bf16", threshold_holdout=0.25, compensation_epochs=1)
    strategy.learn(tiny_stream.train_stream[0])
    assert isinstance(strategy.tasks[0].threshold, float)
    tokens = strategy.backbone.tokenize([f"a photo of a {n}." for n in tiny_stream.class_names])
    text = strategy.zero_shot_text(tokens)
    assert all(t.dtype == torch.float32 for t in text.values())
    images = torch.stack([tiny_stream.test_set[i][0] for i in range(4)])
    predictions = strategy.zero_shot_predictions(images, text)
    assert set(predictions) == {"clip", "fusion", "unknown", "routed"}
    # the one-call form (tokens) gives the same predictions as the precomputed text
    again = strategy.zero_shot_predictions(images, tokens)
    assert all(torch.equal(predictions[k], again[k]) for k in predictions)
