"""The optimisation step: fp16's loss scaler, gradient clipping on true gradients, and a
per-iteration schedule that advances only with the steps taken."""

from __future__ import annotations

import torch


class MixedPrecisionStep:
    """Mixin of ``CLIPStrategy``: Avalanche's ``backward`` and ``optimizer_step``.

    ``scaler`` is a ``GradScaler``, enabled under fp16 alone; ``skipped_steps`` counts the steps it
    skipped (inf/nan gradients) over the stream. Both are set by the base and kept in checkpoints.
    Reads ``loss``, ``optimizer``, ``scheduler``, ``cfg`` and ``_optimized`` (what the optimiser holds).
    """

    scaler: torch.amp.GradScaler
    skipped_steps: int

    def backward(self):
        self.scaler.scale(self.loss).backward()

    def optimizer_step(self):
        if self.cfg.grad_clip > 0:  # on the true gradients: unscale fp16 ones first
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self._optimized, self.cfg.grad_clip)
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
