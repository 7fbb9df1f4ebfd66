"""Numeric precision of a run: ``fp32``, ``tf32`` (fp32 with TensorFloat-32 matmuls on CUDA), or
mixed precision (``fp16`` with a loss scaler, ``bf16``).

The CLIP towers run under autocast in the chosen precision and hand back fp32 features; every
score, loss, softmax and threshold downstream is computed in fp32 (``CLIPBackbone`` does the
casting, so no strategy has to). ``fp16`` scales the loss with ``torch.amp.GradScaler``; ``bf16``
has fp32's exponent range and needs no scaler. On a CPU both use CPU autocast, so the
mixed-precision path can be tested without a GPU.

``tf32`` is an opt-in for the methods whose official code runs in fp32 (their ``auto`` stays fp32):
tensors stay fp32 and the towers' CUDA matmuls round their inputs to TF32's 10-bit mantissa, as
``torch.backends.cuda.matmul`` allows; elsewhere it computes exactly what fp32 does. It is a
precision of its own, so it is recorded in the result and its hash, and a tf32 run never stands in
for an fp32 one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from benchmarks.core.choices import PRECISIONS as PRECISIONS
from benchmarks.core.errors import UserError

AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# The first loss scale of fp16 training. With torch's default, 2**16, and the logits computed under
# autocast, the first 3-4 steps of every run overflowed at CLIP's logit scale 100 (d loss / d cosine
# is up to 100 / batch, times 2**16: past fp16's 65504) and were skipped while the cosine schedule
# advanced. The logits are fp32 now, and the scale starts 64 times lower, so the first step fits with
# room to spare (no step skipped in the CUDA smoke); the scaler still doubles it every 2000 clean steps.
INITIAL_LOSS_SCALE = 2.0**10


def resolve_precision(precision: str | None, device: str | torch.device, amp: bool = True) -> str:
    """``auto`` (or None) is the paper's mixed precision on CUDA, fp16, and fp32 elsewhere; with
    ``amp=False`` (a method whose official code runs in fp32) it is fp32 everywhere."""
    if precision in (None, "auto"):
        return "fp16" if amp and torch.device(device).type == "cuda" else "fp32"
    if precision not in PRECISIONS:
        raise UserError(f"unknown precision {precision!r}; use auto, {', '.join(PRECISIONS)}")
    return precision


def autocast(precision: str, device: str | torch.device) -> contextlib.AbstractContextManager:
    """Autocast to ``precision`` on ``device``'s type; TF32 matmuls for tf32 on CUDA; nothing for fp32."""
    if precision in ("fp32", "tf32"):
        return matmul_precision(precision, device)
    return torch.autocast(torch.device(device).type, dtype=AUTOCAST_DTYPES[precision])


def matmul_precision(precision: str, device: str | torch.device) -> contextlib.AbstractContextManager:
    """The setting of a whole training or evaluation pass, backward passes included: TF32 matmuls for
    tf32 on CUDA, else nothing (autocast applies per forward, in ``autocast``)."""
    if precision == "tf32" and torch.device(device).type == "cuda":
        return tf32_matmuls()
    return contextlib.nullcontext()


@contextlib.contextmanager
def tf32_matmuls() -> Iterator[None]:
    """CUDA's fp32 matmuls in TF32 within the block, then the setting as it was. torch 2.9 added
    ``fp32_precision`` and refuses a mix of it and the older ``allow_tf32``, so the newer is used
    where it exists. Convolutions keep torch's own setting (TF32 by default in cuDNN)."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        before = matmul.fp32_precision
        matmul.fp32_precision = "tf32"
        try:
            yield
        finally:
            matmul.fp32_precision = before
    else:  # torch before 2.9
        before = matmul.allow_tf32
        matmul.allow_tf32 = True
        try:
            yield
        finally:
            matmul.allow_tf32 = before


def loss_scaler(precision: str, device: str | torch.device) -> torch.amp.GradScaler:
    """A ``GradScaler`` that is enabled for fp16 only (bf16 and fp32 do not need one)."""
    return torch.amp.GradScaler(
        torch.device(device).type, init_scale=INITIAL_LOSS_SCALE, enabled=precision == "fp16"
    )
