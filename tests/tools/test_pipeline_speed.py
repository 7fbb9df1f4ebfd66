"""``python -m benchmarks.tools.pipeline_speed`` at tiny sizes: the runner's own path on fake CIFAR-100,
every epoch and stage counted, the reference beside it, and one line for a mistake (no assertion
reads a time)."""

import json
import math

import pytest

from benchmarks.tools import pipeline_speed

ROW_KEYS = {
    "strategy",
    "train_images_per_second",
    "eval_images_per_second",
    "reference_step_images_per_second",
    "reference_forward_images_per_second",
    "train_over_reference_step",
    "eval_over_forward",
    "epochs_timed",
    "stages_timed",
}


@pytest.mark.slow
def test_the_runner_is_timed_over_whole_epochs_and_stages_beside_the_reference(tmp_path, capsys):
    out = tmp_path / "pipeline.json"
    results = pipeline_speed.main(
        [
            "--strategies",
            "finetune,continual_clip",
            "--tasks",
            "2",
            "--epochs",
            "2",
            "--train-per-class",
            "2",
            "--test-per-class",
            "1",
            "--reference-steps",
            "1",
            "--out",
            str(out),
        ]
    )
    table = capsys.readouterr().out
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert {"date", "machine", "model", "rows", "table"} <= set(results) and results["table"] in table
    assert results["model"] == "tiny-clip-32" and results["settings"]["num_workers"] == 0  # the CPU defaults
    finetune, continual = results["rows"]
    assert ROW_KEYS <= set(finetune) and ROW_KEYS <= set(continual)
    # 2 tasks x 2 epochs; each task holds 50 classes x 2 images; every stage scores all 100 test images
    assert finetune["epochs_timed"] == 4 and finetune["train_images"] == 2 * 2 * 100
    assert finetune["stages_timed"] == continual["stages_timed"] == 2
    assert finetune["eval_images"] == 2 * 100
    speeds = [
        finetune[name]
        for name in (
            "train_images_per_second",
            "eval_images_per_second",
            "reference_step_images_per_second",
            "reference_forward_images_per_second",
        )
    ]
    assert all(math.isfinite(value) and value > 0 for value in speeds)
    assert finetune["reference_step_kind"] == "lora_kv"
    assert finetune["train_over_reference_step"] == pytest.approx(
        finetune["train_images_per_second"] / finetune["reference_step_images_per_second"]
    )
    assert finetune["eval_over_forward"] == pytest.approx(
        finetune["eval_images_per_second"] / finetune["reference_forward_images_per_second"]
    )
    assert continual["epochs_timed"] == 0 and continual["train_images_per_second"] is None
    assert continual["notes"] == ["trains nothing"] and continual["eval_images_per_second"] > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--strategies", "no_such_strategy"], "unknown strategy 'no_such_strategy'"),
        (["--epochs", "0"], "--epochs must be at least 1"),
        (["--tasks", "0"], "--tasks must be at least 1"),
        (["--dataset", "mnist"], "--dataset 'mnist' has no fake data"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        pipeline_speed.main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
