"""Strategies under mixed precision, on the CPU: the towers run under autocast while features and
every score stay fp32, and fp16's loss scaler skips overflowing steps without advancing the
schedule. GR4CIL's own fp32 quantities are in ``methods/test_gr4cil_precision.py``."""

import pytest
import torch

import strategies.training.mixed_precision as mixed_precision
from benchmarks.core.precision import INITIAL_LOSS_SCALE
from strategies import base as strategy_base
from strategies.methods.continual_clip import ContinualCLIP
from strategies.methods.finetune import Finetune
from strategies.methods.gr4cil import GR4CIL
from tests.helpers import tiny_strategy


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_towers_autocast_but_features_and_every_score_are_fp32(tiny_stream, precision):
    images = torch.stack([tiny_stream.test_set[i][0] for i in range(6)])
    for cls in (ContinualCLIP, Finetune, GR4CIL):
        strategy = tiny_strategy(cls, tiny_stream, precision)
        strategy.learn(tiny_stream.train_stream[0])  # trains under autocast (and the loss scaler in fp16)
        with torch.no_grad():
            low = strategy.scores(images)
            strategy.backbone.set_precision("fp32")  # the same weights, towers in fp32
            high = strategy.scores(images)
        assert low.dtype == high.dtype == torch.float32, cls.name
        assert low.shape == (6, 10)
        # the same model to the half format's rounding (bf16 keeps 8 bits of mantissa)
        torch.testing.assert_close(low, high, atol=0.03 if precision == "bf16" else 0.004, rtol=0)
        assert not torch.equal(low, high)  # the towers did run in the lower precision
    backbone = strategy.backbone
    backbone.set_precision(precision)
    with torch.no_grad():
        text = backbone.encode_text(backbone.tokenize(["a photo of a red solid circle."]))
    assert text.dtype == torch.float32 and torch.allclose(text.norm(dim=-1), torch.ones(1))


@pytest.mark.slow
def test_loss_scale_overflows_skip_steps_and_the_schedule_follows_the_steps_taken(tiny_stream, monkeypatch):
    """A first scale far too large overflows: those steps are skipped and counted, and the cosine
    schedule advances only with the steps taken. INITIAL_LOSS_SCALE skips none at logit scale 100."""

    def first_step_skipped(init_scale):
        monkeypatch.setattr(
            mixed_precision,
            "loss_scaler",
            lambda precision, device: torch.amp.GradScaler(
                "cpu", init_scale=init_scale, enabled=precision == "fp16"
            ),
        )
        strategy = tiny_strategy(Finetune, tiny_stream, "fp16", batch_size=64)
        strategy.backbone.logit_scale = 100.0  # the openai value (the tiny CLIP learnt a smaller one)
        strategy.learn(tiny_stream.train_stream[0])  # 80 images: 2 steps
        return strategy.skipped_steps, strategy.scheduler.last_epoch

    skipped, scheduler_steps = first_step_skipped(2.0**40)
    assert skipped >= 1 and scheduler_steps == 2 - skipped
    assert first_step_skipped(INITIAL_LOSS_SCALE) == (0, 2)


@pytest.mark.slow
def test_an_fp16_step_does_not_read_the_loss_scale(tiny_stream, monkeypatch):
    """Whether the scaler took a step comes from the optimiser (a step hook), not from
    ``get_scale``, which waits for the device (twice a step: before it, and after it for the
    optimiser's kernels); the scaler's own inf/nan check stays the step's one wait. With overflowing
    steps the counts still agree with the scale's fall."""
    reads = []
    real = torch.amp.GradScaler.get_scale
    monkeypatch.setattr(torch.amp.GradScaler, "get_scale", lambda self: reads.append(1) or real(self))
    monkeypatch.setattr(
        mixed_precision,
        "loss_scaler",
        lambda precision, device: torch.amp.GradScaler("cpu", init_scale=2.0**20, enabled=True),
    )
    strategy = tiny_strategy(Finetune, tiny_stream, "fp16", batch_size=64)
    strategy.backbone.logit_scale = 100.0
    strategy.learn(tiny_stream.train_stream[0])  # 80 images: 2 steps, the first overflows, the second not
    assert reads == []
    halvings = round(torch.log2(torch.tensor(2.0**20 / strategy.scaler.get_scale())).item())
    assert strategy.skipped_steps == halvings == 1
    assert strategy.scheduler.last_epoch == 2 - strategy.skipped_steps


@pytest.mark.slow
def test_tf32_holds_through_every_forward_backward_and_evaluation_of_a_strategy(tiny_stream, monkeypatch):
    """tf32 is torch's matmul setting, not an autocast, so it must span backward passes and the
    runner's evaluation too. On the CPU, ``matmul_precision`` is made to set it as on CUDA; a plugin
    reads the setting at each step's backward, and the scores read it during ``evaluate_dataset``."""
    from avalanche.core import SupervisedPlugin

    from benchmarks.core.precision import matmul_precision
    from strategies.training import evaluation

    def as_on_cuda(precision, device):
        return matmul_precision(precision, "cuda")

    monkeypatch.setattr(strategy_base, "matmul_precision", as_on_cuda)
    monkeypatch.setattr(evaluation, "matmul_precision", as_on_cuda)
    seen = []

    class ReadSetting(SupervisedPlugin):
        def after_backward(self, strategy, **kwargs):
            seen.append(torch.backends.cuda.matmul.fp32_precision)

    before = torch.backends.cuda.matmul.fp32_precision
    strategy = tiny_strategy(Finetune, tiny_stream, "tf32")
    strategy.plugins.append(ReadSetting())
    assert strategy.settings.precision == "tf32" and not strategy.scaler.is_enabled()
    strategy.learn(tiny_stream.train_stream[0])
    assert seen and set(seen) == {"tf32"}
    assert torch.backends.cuda.matmul.fp32_precision == before  # restored after training
    scores_seen = []

    def scores(images):
        scores_seen.append(torch.backends.cuda.matmul.fp32_precision)
        return torch.zeros(len(images), len(strategy.seen_classes))

    monkeypatch.setattr(strategy, "scores", scores)
    strategy.evaluate_dataset(tiny_stream.test_set)
    assert scores_seen and set(scores_seen) == {"tf32"}
    assert torch.backends.cuda.matmul.fp32_precision == before
