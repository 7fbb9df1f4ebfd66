"""``benchmarks.core.precision``: the precision a run uses, autocast and the fp16 loss scaler.
Strategies under mixed precision are tested in ``tests/strategies/test_mixed_precision.py``."""

import pytest
import torch

from benchmarks.core.errors import UserError
from benchmarks.core.precision import INITIAL_LOSS_SCALE, autocast, loss_scaler, resolve_precision


def test_precision_resolves_by_device_and_rejects_unknown_names():
    assert resolve_precision("auto", "cuda") == "fp16" and resolve_precision(None, "cpu") == "fp32"
    assert resolve_precision("bf16", "cpu") == "bf16"
    with pytest.raises(UserError, match="unknown precision 'fp8'"):
        resolve_precision("fp8", "cpu")


def test_autocast_runs_a_matmul_in_the_precision_and_fp32_is_left_alone():
    a, b = torch.ones(2, 3), torch.ones(3, 2)
    with autocast("bf16", "cpu"):
        assert (a @ b).dtype == torch.bfloat16
    with autocast("fp32", "cpu"):
        assert (a @ b).dtype == torch.float32 and not torch.is_autocast_enabled("cpu")


def test_only_fp16_scales_the_loss_and_it_starts_at_the_initial_scale():
    assert INITIAL_LOSS_SCALE == 1024.0
    scaler = loss_scaler("fp16", "cpu")
    assert scaler.is_enabled() and scaler.get_scale() == INITIAL_LOSS_SCALE
    assert not loss_scaler("bf16", "cpu").is_enabled() and not loss_scaler("fp32", "cpu").is_enabled()
    loss = torch.tensor(0.5)
    assert scaler.scale(loss).item() == 512.0  # 0.5 x 2**10


def test_tf32_is_fp32_with_tf32_matmuls_within_the_block_and_the_setting_restored_after():
    from benchmarks.core.precision import matmul_precision, tf32_matmuls

    matmul = torch.backends.cuda.matmul
    assert resolve_precision("tf32", "cuda", amp=False) == "tf32"  # an explicit choice wins over amp
    assert resolve_precision("auto", "cuda", amp=False) == "fp32"  # the official fp32 stays the default
    before = matmul.fp32_precision
    with tf32_matmuls():
        assert matmul.fp32_precision == "tf32"
        with tf32_matmuls():  # nested (a training pass inside a strategy's train): restored in turn
            pass
        assert matmul.fp32_precision == "tf32"
    assert matmul.fp32_precision == before
    with pytest.raises(RuntimeError), tf32_matmuls():  # an error inside leaves the setting as it was
        raise RuntimeError
    assert matmul.fp32_precision == before
    # on a CPU tf32 computes what fp32 does: no autocast, no setting, no loss scaler
    a, b = torch.randn(5, 7), torch.randn(7, 3)
    with autocast("tf32", "cpu"), matmul_precision("tf32", "cpu"):
        assert not torch.is_autocast_enabled("cpu") and matmul.fp32_precision == before
        assert torch.equal(a @ b, torch.mm(a, b)) and (a @ b).dtype == torch.float32
    with matmul_precision("tf32", "cuda"):  # the setting itself needs no device
        assert matmul.fp32_precision == "tf32"
    assert not loss_scaler("tf32", "cpu").is_enabled()
