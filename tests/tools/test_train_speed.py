"""``python -m benchmarks.tools.speed --train`` on a few steps: what it counts and reports is exact,
whatever the timings (no assertion here reads a time)."""

import json
import math

import pytest
import torch

from benchmarks.tools import speed, train_speed


def test_train_speed_times_the_requested_steps_and_reports_ratios_of_its_numbers(tmp_path, capsys):
    out = tmp_path / "train_speed.json"
    results = train_speed.main(
        [
            "--strategies",
            "finetune,continual_clip",
            "--warmup",
            "1",
            "--steps",
            "3",
            "--train-per-class",
            "8",
            "--eval-repeats",
            "1",
            "--out",
            str(out),
        ]
    )
    table = capsys.readouterr().out
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert results["table"] in table and results["machine"]["cpu_count"] >= 1
    assert results["augment_on"] == "device"  # the runner's default, as the runs augment
    finetune, continual = results["rows"]
    assert [finetune["strategy"], continual["strategy"]] == ["finetune", "continual_clip"]
    assert "| finetune | 64 | 3 |" in table and "| continual_clip | 64 | 0 |" in table

    # 80 images a task (batches of 64 and 16): one warm-up step, then three timed ones
    assert finetune["steps_taken"] == 4  # training stopped right after the last timed step
    assert finetune["steps_timed"] == {"train": 3, "data_ceiling": 3, "model_ceiling": 3}
    # every step of the data ceiling trained on the one batch the loader yields, already on the device
    assert finetune["data_ceiling_steps_on_one_batch"] == 4
    assert finetune["model_ceiling"]["reached_tensors"] == finetune["model_ceiling"]["trainable_tensors"] > 0
    assert finetune["model_ceiling"]["text_trains"]  # the text LoRA trains: the bare step encodes text
    speeds = [
        finetune[f"{name}_images_per_second"] for name in ("train", "data_ceiling", "model_ceiling", "eval")
    ] + [finetune["forward_images_per_second"]]
    assert all(math.isfinite(value) and value > 0 for value in speeds)
    assert finetune["train_over_data_ceiling"] == pytest.approx(
        finetune["train_images_per_second"] / finetune["data_ceiling_images_per_second"]
    )
    assert finetune["data_ceiling_over_model_ceiling"] == pytest.approx(
        finetune["data_ceiling_images_per_second"] / finetune["model_ceiling_images_per_second"]
    )
    assert finetune["eval_over_forward_ceiling"] == pytest.approx(
        finetune["eval_images_per_second"] / finetune["forward_images_per_second"]
    )
    assert (
        finetune["eval_images"] == 10 * 20
    )  # the test images of task 1's ten classes (the suite's 20 a class)

    assert continual["notes"] == ["trains nothing"] and continual["steps_taken"] == 0
    assert continual["train_images_per_second"] is None and continual["train_over_data_ceiling"] is None
    assert continual["eval_images_per_second"] > 0


def test_the_data_ceiling_loader_yields_one_batch_object_again_and_again():
    batch = [torch.zeros(2, 3), torch.tensor([0, 1])]
    loader = train_speed.RepeatedBatch(batch, 5)
    for _ in range(2):  # every pass, like an epoch
        yielded = list(loader)
        assert len(loader) == len(yielded) == 5 and all(item is batch for item in yielded)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--strategies", "no_such_strategy"], "unknown strategy 'no_such_strategy'"),
        (["--strategies", "finetune", "--steps", "0"], "--steps must be at least 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        speed.main(["--train", *argv])  # speed's --train hands the rest to train_speed
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
