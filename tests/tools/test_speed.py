"""``python -m benchmarks.tools.speed`` on a small problem: the counts it reports are exact, whatever
the timings."""

import json

import pytest

from benchmarks.tools import measuring, speed


@pytest.mark.slow
def test_speed_counts_branch_forwards_and_writes_its_report(tmp_path):
    out = tmp_path / "speed.json"
    results = speed.main(
        [
            "--tasks",
            "3",
            "--classes-per-task",
            "2",
            "--test-images",
            "6",
            "--batch-size",
            "4",
            "--repeats",
            "1",
            "--text-prompts",
            "40",
            "--out",
            str(out),
        ]
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    evaluation = results["evaluation"]
    # cached: each of the 3 branches sees each image once; recomputed: 1 + 2 + 3 branches per image
    assert evaluation["cached_forwards"] == evaluation["branches_x_images"] == 3 * 6
    assert evaluation["recomputed_forwards"] == 6 * (1 + 2 + 3)
    assert evaluation["forward_reduction"] == 2.0
    assert (
        results["inference"]["max_images_per_forward"] == 240
    )  # "auto" on a CPU: 2**19 // (17 tokens x 128)
    memory = results["training_step"]["saved_activation_bytes"]
    assert set(memory) == {"first_task", "last_task", "1000_classes_chunks_of_256"}
    assert all(value > 0 for value in memory.values())
    step = results["training_step"]
    text = results["text"]
    for ratio in (
        results["inference"]["batched_over_plain"],
        step["gr4cil_over_bare_open_clip"],
        step["gr4cil_over_bare_trimmed"],
        text["compact_over_one_batch"],
        text["one_batch_over_open_clip"],
    ):
        assert ratio > 0
    assert results["precision"] == "fp32" and evaluation["max_score_difference"] <= speed.TOLERANCE["fp32"]
    # the first 40 ImageNet names ("tench", ..., "great grey owl") make prompts of several lengths
    assert text["prompts"] == 40 and text["buckets"] > 1 and 0 < text["padding_fraction"] < 1
    assert text["device_uses"] == "one_batch"  # 40 short prompts on a CPU: compact would not pay


@pytest.mark.slow
def test_speed_checks_its_equalities_under_autocast():
    results = speed.main(
        [
            "--precision",
            "bf16",
            "--tasks",
            "2",
            "--classes-per-task",
            "2",
            "--test-images",
            "4",
            "--batch-size",
            "2",
            "--repeats",
            "1",
            "--text-prompts",
            "8",
            "--only",
            "evaluation",
            "--only",
            "inference",
            "--only",
            "text",
        ]
    )
    assert results["precision"] == "bf16"
    assert results["evaluation"]["max_score_difference"] <= speed.TOLERANCE["bf16"]


def test_speed_can_measure_one_section():
    results = speed.main(
        ["--only", "evaluation", "--tasks", "2", "--classes-per-task", "2", "--test-images", "3"]
    )
    assert set(results) & set(speed.SECTIONS) == {"evaluation"}


def test_median_ratio_pairs_times_of_the_same_round():
    # per-round ratios 2, 3, 4 -> median 3
    assert measuring.median_ratio([2.0, 3.0, 8.0], [1.0, 1.0, 2.0]) == 3.0
    assert measuring.median_ratio([1.0, 4.0, 9.0], [1.0, 4.0, 1.0]) == 1.0  # medians alone would give 4 / 1


def test_interleaved_rounds_rotate_the_order():
    calls = []
    functions = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    times = measuring.interleaved(functions, repeats=3)
    assert calls == list("abc") + list("abc") + list("bca") + list("cab")  # warm-up, then rotated rounds
    assert all(len(t) == 3 for t in times.values())


@pytest.mark.slow
def test_strategy_evaluation_forwards_meet_their_limits():
    results = speed.main(
        [
            "--tasks",
            "2",
            "--classes-per-task",
            "3",
            "--only",
            "strategies",
            "--strategies",
            "continual_clip,gr4cil,adaptervlm,magmax,l2p_pp,aper_adapter,clap",
        ]
    )["strategies"]
    n_images = 2 * 3 * 2  # 6 classes, 2 test images each
    assert results["continual_clip"]["visual_images_per_stage"] == [n_images, 0]  # the frozen tower, once
    for name in ("gr4cil", "adaptervlm"):  # frozen branches cached: only the new branch runs
        assert results[name]["visual_images_per_stage"] == [n_images, n_images]
    assert results["magmax"]["visual_images_per_stage"] == [
        n_images,
        n_images,
    ]  # the merged model, once a stage
    assert results["l2p_pp"]["visual_images_per_stage"] == [
        2 * n_images,
        n_images,
    ]  # the query once, then prompted
    assert results["aper_adapter"]["visual_images_per_stage"] == [
        2 * n_images,
        0,
    ]  # both branches frozen after task 1
    assert results["clap"]["visual_images_per_stage"] == [n_images, 0]  # the frozen tower, once
    assert all(r["over_limit"] == 1.0 for r in results.values())


def test_magmax_memory_accounts_for_the_full_visual_tower():
    from benchmarks.backbone.full_tuning import visual_parameters

    memory = speed.main(["--only", "magmax_memory", "--batch-size", "2"])["magmax_memory"]
    tiny = speed.create_clip(speed.BackboneSpec("tiny-clip-32", None))
    n_params = sum(p.numel() for p in visual_parameters(tiny.model).values())
    assert memory["visual_parameters"] == n_params and memory["weights_grads_adamw_bytes"] == 16 * n_params
    assert (
        memory["saved_activation_bytes_per_step"] > 0
        and memory["peak_rss_bytes"] >= memory["rss_before_training_bytes"]
    )
