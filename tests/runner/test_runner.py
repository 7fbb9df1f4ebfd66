"""End-to-end runs of the runner on small offline suites: results, caching, resume (an fp16 run's
loss scaler and the peak memory included), --deterministic, bad input."""

import json
import os
import subprocess
import sys

import numpy as np
import open_clip
import pytest
import torch
from safetensors.torch import save_file

import strategies.training.mixed_precision as mixed_precision
from benchmarks import run
from benchmarks.core.environment import set_deterministic
from benchmarks.core.errors import UserError
from benchmarks.core.precision import INITIAL_LOSS_SCALE
from benchmarks.data.datasets import load_dataset
from benchmarks.data.transforms import eval_transform
from benchmarks.runner import building, learning
from benchmarks.runner.reading import iter_results
from benchmarks.runner.result_record import REQUIRED_KEYS
from strategies.methods.finetune import Finetune
from tests.helpers import FP16_SUITE, MINI_SUITE, kill_in_task, result_of, runner_command, write_suite

STAGE_KEYS = {"task", "acc", "acc_per_task", "n_test_per_task", "routing_acc", "auroc", "fpr95"}


def _run(suite, results, *extra):
    return run.main(["--suite", suite, "--results-dir", str(results), "--quiet", *extra])


def _results(results_dir):
    return {(r["label"], r["n_tasks"], r["seed"]): r for _, r in iter_results(results_dir)}


@pytest.mark.slow
def test_mini_suite_writes_complete_results_and_skips_finished_runs(mini_suite, tmp_path, capsys):
    results = tmp_path / "results"
    assert _run(mini_suite, results) == 0
    runs = _results(results)
    assert set(runs) == {("continual_clip", 5, 0), ("finetune", 5, 0)}
    for result in runs.values():
        assert set(REQUIRED_KEYS) <= set(result)
        assert sorted(result["class_order"]) == list(range(100))
        assert [c for task in result["tasks"] for c in task] == result["class_order"]
        assert [s["task"] for s in result["stages"]] == [1, 2, 3, 4, 5]
        for stage in result["stages"]:
            assert STAGE_KEYS <= set(stage)
            assert len(stage["acc_per_task"]) == stage["task"]
            assert stage["n_test_per_task"] == [20 * 4] * stage["task"]  # 20 classes x 4 images
            # micro accuracy is the image-weighted mean of the per-task accuracies
            assert stage["acc"] == pytest.approx(
                np.average(stage["acc_per_task"], weights=stage["n_test_per_task"])
            )
            assert stage["routing_acc"] >= stage["acc"]
        assert result["stages"][-1]["auroc"] is None
        assert all(s["auroc"] is not None for s in result["stages"][:-1])
        summary = result["summary"]
        assert summary["avg_acc"] == pytest.approx(np.mean([s["acc"] for s in result["stages"]]))
        assert summary["last_auroc"] == result["stages"][-2]["auroc"]
        assert result["config"]["strategy_config"]["batch_size"] == 32
        assert torch.__version__.startswith(result["env"]["packages"]["torch"])
        assert result["env"]["device"] == "cpu" and result["env"]["git_commit"]
        assert result["cost"]["peak_memory_bytes"] > 0
    assert runs[("continual_clip", 5, 0)]["cost"]["trainable_params"] == 0
    assert runs[("finetune", 5, 0)]["cost"]["trainable_params"] > 0
    assert not (results / ".checkpoints" / "synthetic" / "finetune").exists()  # cleaned up
    table = (results / "table.md").read_text()
    assert "finetune" in table and (results / "table.csv").exists() and (results / "table.tex").exists()

    mtime = (results / "synthetic" / "finetune" / "T5-seed0.json").stat().st_mtime_ns
    capsys.readouterr()
    assert _run(mini_suite, results) == 0
    assert capsys.readouterr().err.count(": cached;") == 2
    assert (results / "synthetic" / "finetune" / "T5-seed0.json").stat().st_mtime_ns == mtime


@pytest.mark.slow
def test_killed_run_resumes_from_last_finished_task_with_identical_metrics(
    mini_suite, tmp_path, monkeypatch, capsys
):
    reference = tmp_path / "reference"
    assert _run(mini_suite, reference, "--strategies", "finetune") == 0

    resumed = tmp_path / "resumed"
    revive = kill_in_task(monkeypatch, Finetune, task=3)
    assert _run(mini_suite, resumed, "--strategies", "finetune") == 130
    checkpoint = resumed / ".checkpoints" / "synthetic" / "finetune" / "T5-seed0"
    state = json.loads((checkpoint / "state.json").read_text())
    assert state["tasks_done"] == 2 and len(state["stages"]) == 2
    assert [p.name for p in checkpoint.glob("*.safetensors")] == ["task-02.safetensors"]
    assert not list(resumed.glob("synthetic/finetune/*.json"))  # no result written for a dead run

    revive()
    capsys.readouterr()
    assert _run(mini_suite, resumed, "--strategies", "finetune") == 0
    assert "resumed after task 2" in capsys.readouterr().err
    ref = _results(reference)[("finetune", 5, 0)]
    res = _results(resumed)[("finetune", 5, 0)]
    strip = lambda stages: [{k: v for k, v in s.items()} for s in stages]  # noqa: E731
    assert strip(res["stages"]) == strip(ref["stages"])
    assert res["summary"] == ref["summary"]


@pytest.mark.slow
def test_killed_fp16_run_resumes_with_its_loss_scaler_and_identical_metrics(tmp_path, monkeypatch):
    # A scaler whose scale doubles after every clean step overflows every few steps: its state at a
    # task boundary decides which later steps are skipped, so a resume must restore it exactly.
    monkeypatch.setattr(
        mixed_precision,
        "loss_scaler",
        lambda precision, device: torch.amp.GradScaler(
            "cpu", init_scale=INITIAL_LOSS_SCALE, growth_interval=1, enabled=precision == "fp16"
        ),
    )
    mini_suite = write_suite(tmp_path / "fp16.toml", FP16_SUITE)
    args = ("--strategies", "finetune", "--precision", "fp16")
    reference = tmp_path / "reference"
    assert _run(mini_suite, reference, *args) == 0
    expected = result_of(reference, "finetune")
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
        return result_of(directory, "finetune")

    resumed = resume(tmp_path / "resumed", keep_scaler=True)
    assert resumed["stages"] == expected["stages"] and resumed["summary"] == expected["summary"]
    assert resumed["cost"]["amp_skipped_steps"] == expected["cost"]["amp_skipped_steps"]
    # without the scaler's state the resumed run starts over at the first scale and skips other steps
    fresh = resume(tmp_path / "fresh", keep_scaler=False)
    assert fresh["cost"]["amp_skipped_steps"] != expected["cost"]["amp_skipped_steps"]


@pytest.mark.slow
def test_peak_memory_is_carried_across_a_resume(mini_suite, tmp_path, monkeypatch):
    revive = kill_in_task(monkeypatch, Finetune, task=3)
    monkeypatch.setattr(learning, "peak_memory", lambda device: (7 * 2**30, "cpu_max_rss"))  # before the kill
    assert _run(mini_suite, tmp_path, "--strategies", "finetune") == 130
    revive()
    monkeypatch.setattr(learning, "peak_memory", lambda device: (2**20, "cpu_max_rss"))  # the resumed process
    assert _run(mini_suite, tmp_path, "--strategies", "finetune") == 0
    assert result_of(tmp_path, "finetune")["cost"]["peak_memory_bytes"] == 7 * 2**30


@pytest.mark.slow
def test_deterministic_flag_is_recorded_and_enables_deterministic_kernels(mini_suite, tmp_path, monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        assert _run(mini_suite, tmp_path / "a", "--strategies", "finetune", "--deterministic") == 0
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert _run(mini_suite, tmp_path / "b", "--strategies", "finetune", "--deterministic") == 0
    finally:
        set_deterministic(False)
    first, second = result_of(tmp_path / "a", "finetune"), result_of(tmp_path / "b", "finetune")
    assert first["config"]["deterministic"] is True and first["stages"] == second["stages"]


@pytest.mark.slow
def test_continual_clip_ignores_default_epochs_and_says_so_once(tmp_path):
    suite = tmp_path / "epochs.toml"
    suite.write_text(MINI_SUITE.replace("[defaults]", "[defaults]\nepochs = 2"))
    proc = subprocess.run(
        runner_command(suite, tmp_path / "r", "--strategies", "continual_clip"),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    notice = "warning: continual_clip trains nothing: it ignores epochs = 2 and records 0\n"
    assert proc.stderr.count(notice) == 1 and "Traceback" not in proc.stderr
    assert result_of(tmp_path / "r", "continual_clip")["config"]["strategy_config"]["epochs"] == 0


@pytest.mark.slow
def test_continual_clip_last_stage_equals_direct_open_clip_zero_shot(mini_suite, tmp_path):
    torch.manual_seed(123)
    reference_model = open_clip.create_model("tiny-clip-32").eval()
    weights = tmp_path / "tiny.safetensors"
    save_file(reference_model.state_dict(), str(weights))
    results = tmp_path / "results"
    assert _run(mini_suite, results, "--strategies", "continual_clip", "--weights", str(weights)) == 0
    last_acc = _results(results)[("continual_clip", 5, 0)]["stages"][-1]["acc"]

    data = load_dataset("synthetic", None, n_train_per_class=10, n_test_per_class=4)
    prompts = [f"a photo of a {name}." for name in data.class_names]
    transform = eval_transform(32)
    images = torch.stack([transform(image) for image, _ in data.test])
    with torch.no_grad():
        text = reference_model.encode_text(open_clip.get_tokenizer("tiny-clip-32")(prompts), normalize=True)
        image = reference_model.encode_image(images, normalize=True)
    predictions = (image @ text.T).argmax(dim=1).numpy()
    direct_acc = 100.0 * np.mean(predictions == np.asarray(data.test_targets))
    assert last_acc == pytest.approx(direct_acc, abs=1e-9)


@pytest.mark.parametrize(
    "args, cause",
    [
        (["--suite", "no-such-suite"], "unknown suite"),
        (["--strategies", "no_such_strategy"], "unknown strategy"),
        (["--datasets", "no_such_dataset"], "unknown dataset"),
        (["--tasks", "7"], "do not divide"),
        (["--datasets", "cifar100", "--data-root", "/nonexistent/data"], "/nonexistent/data"),
        (["--weights", "/nonexistent/w.pt"], "/nonexistent/w.pt"),
        (["--suite", "BAD_AUGMENTATION"], "train_augmentation='heavy'"),
        (["--suite", "BAD_AUGMENT_ON"], "augment_on must be one of device, pil, not 'gpu'"),
    ],
)
def test_bad_input_prints_one_line_and_exits_2(mini_suite, tmp_path, capsys, args, cause):
    argv = ["--suite", mini_suite, "--results-dir", str(tmp_path / "r"), "--quiet", *args]
    if args[0] == "--weights":  # a tag-less run needs pretrained weights to look for
        argv = ["--suite", "smoke", "--results-dir", str(tmp_path / "r"), "--quiet", *args]
    if args == ["--suite", "BAD_AUGMENTATION"]:
        suite = tmp_path / "bad.toml"
        suite.write_text(
            MINI_SUITE.replace("n_test_per_class = 4", "n_test_per_class = 4\ntrain_augmentation = 'heavy'")
        )
        argv = ["--suite", str(suite), "--results-dir", str(tmp_path / "r"), "--quiet"]
    if args == ["--suite", "BAD_AUGMENT_ON"]:
        suite = tmp_path / "bad.toml"
        suite.write_text('augment_on = "gpu"\n' + MINI_SUITE)
        argv = ["--suite", str(suite), "--results-dir", str(tmp_path / "r"), "--quiet"]
    assert run.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and cause in err[0]
    assert not (tmp_path / "r").exists() or not list((tmp_path / "r").rglob("*.json"))


@pytest.mark.slow
def test_cli_errors_have_no_traceback_in_a_real_process(tmp_path):
    for argv in (["--suite", "no-such-suite"], ["--tasks", "x"]):
        proc = subprocess.run([sys.executable, "-m", "benchmarks.run", *argv], capture_output=True, text=True)
        assert proc.returncode == 2
        assert "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_train_augmentation_is_the_strategys_unless_the_suite_sets_it(mini_suite):
    from benchmarks.runner.suites import expand, load_suite

    suite = load_suite(mini_suite)
    chosen = {
        spec.strategy: building.resolve(spec, "data").strategy_cfg.train_augmentation
        for spec in expand(suite)
    }
    assert chosen == {"continual_clip": "none", "finetune": "paper"}  # each strategy's own default

    suite["dataset"]["synthetic"]["train_augmentation"] = "paper-scaled"
    for spec in expand(suite):
        run_resolved = building.resolve(spec, "data")
        config, resolved = run_resolved.strategy_cfg, run_resolved.config
        assert config.train_augmentation == "paper-scaled"
        assert resolved["strategy_config"]["train_augmentation"] == "paper-scaled"  # the result records it

    suite = load_suite(mini_suite)
    suite.setdefault("strategy", {})["finetune"] = {"train_augmentation": "heavy"}
    with pytest.raises(UserError, match="train_augmentation='heavy'"):
        building.resolve(expand(suite, strategies=["finetune"])[0], "data")
