"""The optimisation step: fp16's loss scaler, gradient clipping on true gradients, and a
per-iteration schedule that advances only with the steps taken."""

from __future__ import annotations

import torch

from benchmarks.core.precision import loss_scaler
from strategies.training.host import StrategyHost


class MixedPrecisionStep(StrategyHost):
    """Mixin of ``CLIPStrategy``: Avalanche's ``backward`` and ``optimizer_step``, and the
    ``finish_backward`` hook between them.

    ``scaler`` is a ``GradScaler``, enabled under fp16 alone; ``skipped_steps`` counts the steps it
    skipped (inf/nan gradients) over the stream; both are kept in checkpoints. ``optimized_tensors``
    is what the current task's optimiser holds (``make_optimizer`` sets it): the tensors clipped,
    and those the watchdog watches. Reads ``precision``, ``loss``, ``optimizer``, ``scheduler`` and
    ``cfg``.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.scaler = loss_scaler(self.settings.precision, self.device)  # disabled but for fp16
        self.skipped_steps = 0
        self.optimized_tensors: list[torch.Tensor] = []

    def backward(self):
        self.scaler.scale(self.loss).backward()
        self.finish_backward()

    def finish_backward(self) -> None:
        """Hook: after the loss's backward pass of each training step, before the optimiser step;
        push gradients the loss's graph did not reach (GR4CIL's chunked text backward). The
        gradients are those of the scaled loss under fp16. Nothing by default."""

    def optimizer_step(self):
        if self.cfg.grad_clip > 0:  # on the true gradients: unscale fp16 ones first
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.optimized_tensors, self.cfg.grad_clip)
        if not self.scaler.is_enabled():
            self.optimizer.step()
            stepped = True
        else:  # fp16: the scaler skips a step with inf/nan gradients and lowers its scale
            stepped = self._scaled_step()
            self.skipped_steps += not stepped
        if stepped and self.scheduler is not None and self.cfg.schedule == "cosine_iter":
            self.scheduler.step()  # the schedule follows the steps taken

    def _scaled_step(self) -> bool:
        """The scaler's step and update; whether it stepped, without reading the scale (get_scale
        waits for the device: once before the step, and once more after it for the optimiser's
        kernels). The scaler calls optimizer.step() exactly when it takes the step
        (build_optimizer's are not fused)."""
        taken: list[bool] = []
        hook = self.optimizer.register_step_post_hook(lambda *_: taken.append(True))
        try:
            self.scaler.step(self.optimizer)  # its inf/nan check: the step's one wait for the device
        finally:
            hook.remove()
        self.scaler.update()
        return bool(taken)
