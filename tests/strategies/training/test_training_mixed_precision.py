"""``strategies.training.mixed_precision``: under fp16 a step with inf gradients is skipped, counted,
and leaves the per-iteration schedule where it was; a finite step is taken; without a scaler every
step is taken; gradient clipping sees the true (unscaled) gradients."""

import types

import torch

from strategies.training.mixed_precision import MixedPrecisionStep


class Step(MixedPrecisionStep):
    def __init__(self, enabled: bool, grad_clip: float = 0.0, init_scale: float = 2.0**10):
        self.weight = torch.nn.Parameter(torch.ones(3))
        self.optimized_tensors = [self.weight]
        self.optimizer = torch.optim.SGD(self.optimized_tensors, lr=0.1)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: 1.0)
        self.cfg = types.SimpleNamespace(grad_clip=grad_clip, schedule="cosine_iter")
        self.scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, enabled=enabled)
        self.skipped_steps = 0

    def train_step(self, scale: float) -> None:
        self.optimizer.zero_grad()
        self.loss = (self.weight * scale).sum()
        self.backward()
        self.optimizer_step()


def test_an_inf_step_is_skipped_counted_and_holds_the_schedule():
    step = Step(enabled=True)
    step.train_step(float("inf"))
    assert step.skipped_steps == 1 and step.scheduler.last_epoch == 0
    assert torch.equal(step.weight.detach(), torch.ones(3))
    assert step.scaler.get_scale() == 2.0**9  # the scaler lowered its scale
    step.train_step(1.0)
    assert step.skipped_steps == 1 and step.scheduler.last_epoch == 1
    torch.testing.assert_close(step.weight.detach(), torch.full((3,), 0.9))  # the true gradient, 1


def test_without_a_scaler_every_step_is_taken():
    step = Step(enabled=False)
    step.train_step(2.0)
    assert step.skipped_steps == 0 and step.scheduler.last_epoch == 1
    torch.testing.assert_close(step.weight.detach(), torch.full((3,), 0.8))


def test_clipping_sees_the_unscaled_gradients():
    step = Step(enabled=True, grad_clip=1.0)
    step.train_step(1.0)  # gradient (1, 1, 1) of norm sqrt(3), scaled by 2**10 before unscaling
    torch.testing.assert_close(step.weight.detach(), torch.full((3,), 1 - 0.1 / 3**0.5))
