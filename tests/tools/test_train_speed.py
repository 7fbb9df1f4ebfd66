"""``python -m benchmarks.tools.speed --train`` on a few steps: what it counts and reports is exact,
whatever the timings (no assertion here reads a time), and each strategy's trainable set is the
one its reference step builds plainly."""

import json
import math

import pytest
import torch

from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
from benchmarks.tools import reference_pairing, speed, train_speed
from benchmarks.tools.reference import TrainableSet
from strategies.registry import get_strategy
from strategies.settings import RunSettings

ROW_KEYS = {
    "strategy",
    "precision",
    "batch_size",
    "train_images_per_second",
    "own_step_images_per_second",
    "eval_images_per_second",
    "reference",
    "aten_ops",
    "train_over_reference_step",
    "train_over_full_step",
    "eval_over_forward",
    "notes",
}
REFERENCE_KEYS = {
    "forward_images_per_second",
    "step_images_per_second",
    "step_kind",
    "full_step_images_per_second",
    "frozen_backward_images_per_second",
}


@pytest.mark.slow
def test_train_speed_times_the_requested_steps_and_reports_ratios_to_the_reference(tmp_path, capsys):
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
    assert {"date", "machine", "model", "rows", "table"} <= set(results)
    assert results["table"] in table and results["machine"]["cpu_count"] >= 1
    assert results["augment_on"] == "device"  # the runner's default, as the runs augment
    finetune, continual = results["rows"]
    assert [finetune["strategy"], continual["strategy"]] == ["finetune", "continual_clip"]
    assert ROW_KEYS <= set(finetune) and ROW_KEYS <= set(continual)
    assert set(finetune["reference"]) == set(continual["reference"]) == REFERENCE_KEYS
    assert "| finetune | fp32 | 64 | 3 |" in table and "| continual_clip | fp32 | 64 | 0 |" in table

    # 80 images a task (batches of 64 and 16): one warm-up step, then three timed ones
    assert finetune["steps_taken"] == 4  # training stopped right after the last timed step
    assert finetune["steps_timed"] == {"train": 3, "own_step": 3, "reference_step": 3}
    # every step of the own-step copy trained on the one batch the loader yields, already on the device
    assert finetune["own_step_steps_on_one_batch"] == 4
    ref = finetune["reference"]
    assert ref["step_kind"] == "lora_kv"
    assert list(finetune["reference_trainable"]["towers"]) == ["visual", "text"]  # fine-tuning's two LoRAs
    assert finetune["reference_trainable"]["rank"] == 8  # smoke-baselines' LoRA rank
    speeds = [finetune[f"{name}_images_per_second"] for name in ("train", "own_step", "eval")] + [
        ref[f"{name}_images_per_second"] for name in ("forward", "step", "full_step", "frozen_backward")
    ]
    assert all(math.isfinite(value) and value > 0 for value in speeds)
    assert finetune["train_over_reference_step"] == pytest.approx(
        finetune["train_images_per_second"] / ref["step_images_per_second"]
    )
    assert finetune["train_over_full_step"] == pytest.approx(
        finetune["train_images_per_second"] / ref["full_step_images_per_second"]
    )
    assert finetune["eval_over_forward"] == pytest.approx(
        finetune["eval_images_per_second"] / ref["forward_images_per_second"]
    )
    ops = finetune["aten_ops"]
    assert ops["strategy"] > 0 and ops["reference"] > 0
    assert ops["ratio"] == pytest.approx(ops["strategy"] / ops["reference"])
    # the test images of task 1's ten classes (the suite's 20 a class)
    assert finetune["eval_images"] == 10 * 20

    assert continual["notes"] == ["trains nothing"] and continual["steps_taken"] == 0
    assert continual["train_images_per_second"] is None and continual["train_over_reference_step"] is None
    assert continual["aten_ops"] is None and continual["reference"]["step_images_per_second"] is None
    assert continual["eval_images_per_second"] > 0 and continual["reference"]["forward_images_per_second"] > 0


def _strategy(name: str, **options):
    backbone = create_clip(BackboneSpec(TINY_MODEL, None))
    cls = get_strategy(name)
    strategy = cls(
        backbone=backbone,
        class_names=[f"class {i}" for i in range(4)],
        config=cls.Config(**options),
        settings=RunSettings(show_progress=False),
    )
    strategy.current_classes = [0, 1, 2, 3]
    strategy._local_index = torch.arange(4)
    strategy.setup_task(0, [0, 1, 2, 3])
    return strategy


@pytest.mark.parametrize(
    ("name", "options", "expected"),
    [
        (
            "finetune",
            {"lora_rank": 3, "lora_alpha": 1.5},
            TrainableSet("lora_kv", ("visual", "text"), 3, 0.5),
        ),
        ("aper_adapter", {"bottleneck": 6}, TrainableSet("mlp_adapter", ("visual",), bottleneck=6)),
        (
            "moe4cl",
            {"experts": 3, "top_k": 2, "bottleneck": 5},
            TrainableSet("mlp_adapter", ("visual", "text"), bottleneck=5, experts=3, top_k=2),
        ),
        ("magmax", {}, TrainableSet("full_visual", ("visual",))),
        ("continual_clip", {}, TrainableSet()),
    ],
)
def test_the_reference_gets_each_strategy_trainable_set(name, options, expected):
    assert reference_pairing.trainable_set(_strategy(name, **options)) == expected


def test_a_strategy_step_counts_more_ops_than_nothing_and_the_same_each_time():
    strategy = _strategy("finetune", lora_rank=2)
    images, targets = torch.randn(4, 3, 32, 32), torch.arange(4)
    first = reference_pairing.strategy_step_ops(strategy, images, targets)
    assert sum(first.values()) > 0 and first == reference_pairing.strategy_step_ops(strategy, images, targets)


def test_the_own_step_loader_yields_one_batch_object_again_and_again():
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
