"""The GPU path, checked on the CPU: precision (fp32 / fp16 with a loss scaler / bf16), exact resume
under mixed precision, determinism, data loaders with workers under every start method, text in
length buckets, and text encoded once per evaluation."""

import json
import subprocess
import sys

import pytest
import torch

from benchmarks import run
from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip, use_compact_text
from benchmarks.core.environment import set_deterministic
from benchmarks.core.errors import UserError
from benchmarks.core.precision import INITIAL_LOSS_SCALE, resolve_precision
from benchmarks.data.datasets import load_dataset
from benchmarks.data.streams import build_stream
from benchmarks.data.transforms import eval_transform
from benchmarks.runner import execute
from benchmarks.runner.results import iter_results
from benchmarks.tools.loader_speed import LoaderProbe, loader_workers
from strategies import base as strategy_base
from strategies.continual_clip import ContinualCLIP
from strategies.finetune import Finetune
from strategies.gr4cil import GR4CIL
from tests.helpers import MINI_SUITE, kill_in_task


def _run(suite, results, *extra):
    return run.main(["--suite", suite, "--results-dir", str(results), "--quiet", *extra])


def _result(results_dir, label):
    return next(r for _, r in iter_results(results_dir) if r["label"] == label)


@pytest.fixture(scope="module")
def tiny_stream():
    data = load_dataset("synthetic", n_classes=20, n_train_per_class=8, n_test_per_class=3)
    transform = eval_transform(32)
    return build_stream(data, 2, list(range(20)), transform, transform)


def _strategy(cls, stream, precision="fp32", **config):
    torch.manual_seed(0)
    backbone = create_clip(BackboneSpec(TINY_MODEL, "synthetic"))
    options = {
        "batch_size": 16,
        "eval_batch_size": 16,
        "lora_rank": 4,
        "lora_alpha": 4.0,
        **({} if cls is ContinualCLIP else {"epochs": 1}),
        **config,
    }
    return cls(
        backbone=backbone,
        class_names=stream.class_names,
        config=cls.Config(**options),
        precision=precision,
        show_progress=False,
    )


# --------------------------------------------------------------------------- precision


def test_precision_resolves_by_device_and_rejects_unknown_names():
    assert resolve_precision("auto", "cuda") == "fp16" and resolve_precision(None, "cpu") == "fp32"
    assert resolve_precision("bf16", "cpu") == "bf16"
    with pytest.raises(UserError, match="unknown precision 'fp8'"):
        resolve_precision("fp8", "cpu")


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_towers_autocast_but_features_and_every_score_are_fp32(tiny_stream, precision):
    images = torch.stack([tiny_stream.test_set[i][0] for i in range(6)])
    for cls in (ContinualCLIP, Finetune, GR4CIL):
        strategy = _strategy(cls, tiny_stream, precision)
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
def test_gr4cil_thresholds_and_zero_shot_msps_are_fp32(tiny_stream):
    strategy = _strategy(GR4CIL, tiny_stream, "bf16", threshold_holdout=0.25, compensation_epochs=1)
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


@pytest.mark.slow
def test_loss_scale_overflows_skip_steps_and_the_schedule_follows_the_steps_taken(tiny_stream, monkeypatch):
    """A first scale far too large overflows: those steps are skipped and counted, and the cosine
    schedule advances only with the steps taken. INITIAL_LOSS_SCALE skips none at logit scale 100."""

    def first_step_skipped(init_scale):
        monkeypatch.setattr(
            strategy_base,
            "loss_scaler",
            lambda precision, device: torch.amp.GradScaler(
                "cpu", init_scale=init_scale, enabled=precision == "fp16"
            ),
        )
        strategy = _strategy(Finetune, tiny_stream, "fp16", batch_size=64)
        strategy.backbone.logit_scale = 100.0  # the openai value (the tiny CLIP learnt a smaller one)
        strategy.learn(tiny_stream.train_stream[0])  # 80 images: 2 steps
        return strategy.skipped_steps, strategy.scheduler.last_epoch

    skipped, scheduler_steps = first_step_skipped(2.0**40)
    assert skipped >= 1 and scheduler_steps == 2 - skipped
    assert first_step_skipped(INITIAL_LOSS_SCALE) == (0, 2)


@pytest.mark.slow
def test_killed_fp16_run_resumes_with_its_loss_scaler_and_identical_metrics(
    mini_suite, tmp_path, monkeypatch
):
    # A scaler whose scale doubles after every clean step overflows every few steps: its state at a
    # task boundary decides which later steps are skipped, so a resume must restore it exactly.
    monkeypatch.setattr(
        strategy_base,
        "loss_scaler",
        lambda precision, device: torch.amp.GradScaler(
            "cpu", init_scale=INITIAL_LOSS_SCALE, growth_interval=1, enabled=precision == "fp16"
        ),
    )
    args = ("--strategies", "finetune", "--precision", "fp16")
    reference = tmp_path / "reference"
    assert _run(mini_suite, reference, *args) == 0
    expected = _result(reference, "finetune")
    assert expected["config"]["precision"] == "fp16" and expected["cost"]["amp_skipped_steps"] > 0

    def resume(directory, keep_scaler):
        real_load = Finetune.load_checkpoint_state

        def load(self, tensors, meta):
            real_load(self, tensors, meta if keep_scaler else {**meta, "loss_scaler": {}})

        revive = kill_in_task(monkeypatch, Finetune, task=3)
        assert _run(mini_suite, directory, *args) == 130
        revive()
        monkeypatch.setattr(Finetune, "load_checkpoint_state", load)
        assert _run(mini_suite, directory, *args) == 0
        monkeypatch.setattr(Finetune, "load_checkpoint_state", real_load)
        return _result(directory, "finetune")

    resumed = resume(tmp_path / "resumed", keep_scaler=True)
    assert resumed["stages"] == expected["stages"] and resumed["summary"] == expected["summary"]
    assert resumed["cost"]["amp_skipped_steps"] == expected["cost"]["amp_skipped_steps"]
    # without the scaler's state the resumed run starts over at the first scale and skips other steps
    fresh = resume(tmp_path / "fresh", keep_scaler=False)
    assert fresh["cost"]["amp_skipped_steps"] != expected["cost"]["amp_skipped_steps"]


@pytest.mark.slow
def test_peak_memory_is_carried_across_a_resume(mini_suite, tmp_path, monkeypatch):
    revive = kill_in_task(monkeypatch, Finetune, task=3)
    monkeypatch.setattr(execute, "peak_memory", lambda device: (7 * 2**30, "cpu_max_rss"))  # before the kill
    assert _run(mini_suite, tmp_path, "--strategies", "finetune") == 130
    revive()
    monkeypatch.setattr(execute, "peak_memory", lambda device: (2**20, "cpu_max_rss"))  # the resumed process
    assert _run(mini_suite, tmp_path, "--strategies", "finetune") == 0
    assert _result(tmp_path, "finetune")["cost"]["peak_memory_bytes"] == 7 * 2**30


@pytest.mark.slow
def test_deterministic_flag_is_recorded_and_enables_deterministic_kernels(mini_suite, tmp_path, monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        assert _run(mini_suite, tmp_path / "a", "--strategies", "finetune", "--deterministic") == 0
        assert torch.are_deterministic_algorithms_enabled()
        import os

        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert _run(mini_suite, tmp_path / "b", "--strategies", "finetune", "--deterministic") == 0
    finally:
        set_deterministic(False)
    first, second = _result(tmp_path / "a", "finetune"), _result(tmp_path / "b", "finetune")
    assert first["config"]["deterministic"] is True and first["stages"] == second["stages"]


@pytest.mark.slow
def test_continual_clip_ignores_default_epochs_and_says_so_once(tmp_path):
    suite = tmp_path / "epochs.toml"
    suite.write_text(MINI_SUITE.replace("[defaults]", "[defaults]\nepochs = 2"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.run",
            "--suite",
            str(suite),
            "--results-dir",
            str(tmp_path / "r"),
            "--quiet",
            "--strategies",
            "continual_clip",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    notice = "warning: continual_clip trains nothing: it ignores epochs = 2 and records 0\n"
    assert proc.stderr.count(notice) == 1 and "Traceback" not in proc.stderr
    assert _result(tmp_path / "r", "continual_clip")["config"]["strategy_config"]["epochs"] == 0


# --------------------------------------------------------------------------- data loading


def test_avalanche_builds_the_training_loader_with_the_configured_workers(tiny_stream):
    probe = LoaderProbe()
    torch.manual_seed(0)
    strategy = Finetune(
        backbone=create_clip(BackboneSpec(TINY_MODEL, "synthetic")),
        class_names=tiny_stream.class_names,
        show_progress=False,
        plugins=[probe],
        config=Finetune.Config(epochs=2, batch_size=16, num_workers=2, lora_rank=4, lora_alpha=4.0),
    )
    strategy.learn(tiny_stream.train_stream[0])  # Avalanche's own train(): no loader arguments passed
    assert loader_workers(probe.loader) == 2 and probe.loader.persistent_workers
    assert not probe.loader.pin_memory  # pinned only on CUDA
    assert strategy.loader_options() == {"num_workers": 2, "persistent_workers": True, "pin_memory": False}


def test_loading_benchmark_reports_images_per_second_for_each_worker_count(tmp_path):
    from benchmarks.tools import loader_speed as loading

    out = tmp_path / "loading.json"
    results = loading.main(
        [
            "--workers",
            "0,2",
            "--epochs",
            "1",
            "--train-per-class",
            "4",
            "--batch-size",
            "8",
            "--out",
            str(out),
        ]
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert [row["loader_workers"] for row in results["rows"]] == [0, 2]
    for row in results["rows"]:
        assert (
            row["images"] == 40
            and row["loader_images_per_second"] > 0
            and row["training_images_per_second"] > 0
        )
        assert row["seeding_cost"] == pytest.approx(
            row["plain_loader_images_per_second"] / row["loader_images_per_second"]
        )
    assert results["rows"][0]["training_speedup"] == 1.0


WORKER_SUITE = """
datasets = ["synthetic"]
tasks = [1]
seeds = [0]
strategies = ["gr4cil"]
device = "cpu"
zero_shot_targets = ["synthetic"]
[backbone]
model = "tiny-clip-32"
pretrained = "synthetic"
[dataset.synthetic]
n_classes = 10
n_train_per_class = 4
n_test_per_class = 2
[defaults]
batch_size = 8
eval_batch_size = 16
lora_rank = 2
lora_alpha = 2.0
num_workers = 2
[strategy.gr4cil]
epochs = 2
compensation_epochs = 2
threshold_holdout = 0.25
"""


def _run_with_start_method(root, method: str, workers: int):
    suite = root / f"workers-{method}-{workers}.toml"
    suite.write_text(WORKER_SUITE.replace("num_workers = 2", f"num_workers = {workers}"))
    code = (
        "import multiprocessing, sys; multiprocessing.set_start_method(sys.argv[1]); "
        "from benchmarks import run; sys.exit(run.main(sys.argv[2:]))"
    )
    results = root / f"r-{method}-{workers}"
    proc = subprocess.run(
        [sys.executable, "-c", code, method, "--suite", str(suite), "--results-dir", str(results), "--quiet"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return results


@pytest.fixture(scope="module")
def without_workers(tmp_path_factory):
    return _run_with_start_method(tmp_path_factory.mktemp("no-workers"), "fork", 0)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_training_and_zero_shot_run_with_workers_under_every_start_method(tmp_path, method, without_workers):
    """Nothing that crosses to a worker may be a lambda or a local function (Python 3.14 makes
    forkserver Linux's default; macOS uses spawn); and the numbers are those of a run with no
    workers (``benchmarks.data.loaders``)."""
    from tests.helpers import numbers_of_runs

    results = _run_with_start_method(tmp_path, method, 2)
    result = _result(results, "gr4cil")
    assert result["config"]["strategy_config"]["num_workers"] == 2
    assert result["zero_shot"]["synthetic"]["n_test"] == 100 * 20  # the target's whole test split
    assert numbers_of_runs(results) == numbers_of_runs(without_workers)


# --------------------------------------------------------------------------- text


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


def test_evaluation_encodes_the_text_once_per_call(tiny_stream, monkeypatch):
    strategy = _strategy(Finetune, tiny_stream, eval_batch_size=4)  # 60 test images: 15 batches
    strategy.learn(tiny_stream.train_stream[0])
    calls = []
    real_encode = type(strategy.backbone).encode_text
    monkeypatch.setattr(
        type(strategy.backbone),
        "encode_text",
        lambda self, *a, **k: calls.append(1) or real_encode(self, *a, **k),
    )
    scores = strategy.evaluate_dataset(tiny_stream.test_set)
    assert len(calls) == 1 and scores.shape == (60, 10)
    with torch.no_grad():
        per_batch = torch.cat(
            [
                strategy.scores(torch.stack([tiny_stream.test_set[i][0] for i in range(j, j + 4)]))
                for j in range(0, 8, 4)
            ]
        )
    torch.testing.assert_close(scores[:8], per_batch, atol=0, rtol=0)
    assert len(calls) == 3  # outside an evaluation pass the text is encoded per call, as it may be training
