"""Checks written for a GPU. Each body runs on the CPU as well wherever it means something there
(CPU autocast standing in for CUDA's), so a wrong shape or type shows without a GPU; the ``cuda``
cases are skipped without one. The speed and reproducibility figures for CUDA in docs/ come from
running this file, ``benchmarks.tools.speed`` and ``benchmarks.tools.loader_speed`` on one
(``python -m benchmarks.tools.gpu_check`` runs them all)."""

import pytest
import torch

from benchmarks import run
from benchmarks.backbone import BackboneSpec, create_clip
from benchmarks.core.environment import set_deterministic
from strategies.methods.finetune import Finetune
from strategies.methods.gr4cil import GR4CIL
from strategies.settings import RunSettings
from tests.helpers import FP16_SUITE, MINI_SUITE, kill_in_task, result_of, write_suite

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = pytest.param("cuda", marks=needs_cuda)
# The runs take seconds on the CPU: slow there, and the CUDA cases keep the module's fast tier as it was.
DEVICES = [pytest.param("cpu", marks=pytest.mark.slow), CUDA]


def _run(suite, results, device, *extra):
    return run.main(["--suite", suite, "--results-dir", str(results), "--quiet", "--device", device, *extra])


# CUDA only: it checks that the step queues its kernels without a host sync, which the CPU, having no
# queue, cannot show (torch.cuda.set_sync_debug_mode exists only for CUDA).
@needs_cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("chunk", ["auto", 8])
def test_stage1_step_never_waits_for_the_device(precision, chunk):
    """A GR4CIL stage-1 step (forward, losses, backward, chunked or not) queues its kernels without
    one host sync; fp16's loss scaler syncs in ``scaler.step`` by design, so it is left out here."""
    torch.manual_seed(0)
    backbone = create_clip(BackboneSpec("ViT-B-16-quickgelu", None), "cuda")
    names = [f"class {i}" + " x" * (i % 5) for i in range(30)]  # prompts of several lengths
    strategy = GR4CIL(
        backbone=backbone,
        class_names=names,
        config=GR4CIL.Config(text_chunk_size=chunk),
        settings=RunSettings(device="cuda", precision=precision, show_progress=False),
    )
    strategy.setup_task(0, list(range(20, 30)))
    strategy.seen_classes, strategy.current_classes = list(range(20)), list(range(20, 30))
    strategy.anchors = torch.nn.functional.normalize(torch.randn(20, backbone.embed_dim), dim=1)
    strategy._local_index = torch.full((30,), -1, dtype=torch.long, device="cuda")
    strategy._local_index[20:] = torch.arange(10, device="cuda")
    backbone.train()
    images = torch.randn(8, 3, 224, 224, device="cuda")
    labels = torch.randint(20, 30, (8,), device="cuda")

    def step():
        strategy.loss = strategy.compute_loss(strategy.compute_logits(images), strategy._local_index[labels])
        strategy.backward()

    step()  # first step: prompts prepared, anchors copied
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("device", DEVICES)
def test_killed_fp16_run_resumes_bit_identically_with_deterministic_kernels(device, tmp_path, monkeypatch):
    mini_suite = write_suite(tmp_path / "fp16.toml", FP16_SUITE)
    args = ("--strategies", "finetune", "--precision", "fp16", "--deterministic")
    try:
        assert _run(mini_suite, tmp_path / "reference", device, *args) == 0
        revive = kill_in_task(monkeypatch, Finetune, task=3)
        assert _run(mini_suite, tmp_path / "resumed", device, *args) == 130
        revive()
        assert _run(mini_suite, tmp_path / "resumed", device, *args) == 0
    finally:
        set_deterministic(False)
    expected, resumed = (
        result_of(tmp_path / "reference", "finetune"),
        result_of(tmp_path / "resumed", "finetune"),
    )
    assert resumed["config"]["precision"] == "fp16" and resumed["config"]["device"] == device
    assert resumed["stages"] == expected["stages"] and resumed["summary"] == expected["summary"]
    assert resumed["cost"]["amp_skipped_steps"] == expected["cost"]["amp_skipped_steps"]


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_reruns_are_bit_identical(device, mini_suite, tmp_path):
    suite = tmp_path / "gr.toml"
    suite.write_text(
        MINI_SUITE.replace('strategies = ["continual_clip", "finetune"]', 'strategies = ["gr4cil"]')
        + "[strategy.gr4cil]\nepochs = 2\ncompensation_epochs = 1\n"
    )
    try:
        for name in ("a", "b"):
            assert _run(str(suite), tmp_path / name, device, "--deterministic") == 0
    finally:
        set_deterministic(False)
    first, second = result_of(tmp_path / "a", "gr4cil"), result_of(tmp_path / "b", "gr4cil")
    assert first["config"]["deterministic"] and first["config"]["device"] == device
    assert first["stages"] == second["stages"]
    assert first["diagnostics"] == second["diagnostics"]


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_moe_router_gates_under_autocast(device, dtype):
    """CUDA autocast runs softmax in float32 over half logits: the gates take the softmax's type
    (MoE4CL's evaluation under --precision fp16 crashed in scatter on an H200, 2026-11-26). CPU
    autocast keeps the softmax in the half type: the same code, the gates in that type. The weights
    are ``[d, E]`` (d = 16 features, E = 6 experts), as ``Router`` holds them."""
    from benchmarks.backbone.mlp_adapters import noisy_top_k_gates

    torch.manual_seed(0)
    x0 = torch.randn(4, 16, device=device)
    w_gate, w_noise = (torch.randn(16, 6, device=device) for _ in range(2))
    with torch.autocast(device, dtype=dtype):
        gates = noisy_top_k_gates(x0.to(dtype), w_gate.to(dtype), w_noise.to(dtype), 2, None)
        softmax_type = torch.ones(2, device=device, dtype=dtype).softmax(-1).dtype
    halves = [t.to(dtype).float() for t in (x0, w_gate, w_noise)]
    reference = noisy_top_k_gates(*halves, 2, None)
    assert gates.shape == (4, 6) and gates.dtype == (torch.float32 if device == "cuda" else softmax_type)
    assert ((gates > 0).sum(-1) == 2).all()
    sum_atol = 1e-2 if device == "cpu" else 1e-8  # CUDA's float32 gates: allclose's own default, as before
    assert torch.allclose(gates.float().sum(-1), torch.ones(4, device=device), atol=sum_atol)
    assert torch.allclose(gates.float(), reference, atol=1e-2)
