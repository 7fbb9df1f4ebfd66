"""``benchmarks.tools.gpu_check`` (the check a user runs on a GPU before a long run) and the GPU-hours
line of ``benchmarks.run --dry-run`` that reads its rates. The phases here are tiny stand-ins
(``Phase`` values), so the command itself is tested end to end in seconds, without a GPU."""

import json

import pytest
import torch

from benchmarks import run
from benchmarks.tools import gpu_check
from benchmarks.tools.gpu_check import Phase

PY = "{python}"


def _script(code: str) -> tuple[str, ...]:
    return (PY, "-c", code)


def _writes(name: str, data) -> tuple[str, ...]:
    """A command that writes ``data`` as JSON to ``{out}/name`` (its folders made)."""
    text = json.dumps(data)
    return _script(
        f"import pathlib, sys; p = pathlib.Path(sys.argv[1]); p.parent.mkdir(parents=True, exist_ok=True); "
        f"p.write_text({text!r})"
    ) + ("{out}/" + name,)


SPEED_ROWS = {
    "rows": [
        {  # meets both goals
            "strategy": "finetune",
            "precision": "fp16",
            "train_images_per_second": 1500.0,
            "reference": {
                "step_images_per_second": 1600.0,
                "step_kind": "lora",
                "full_step_images_per_second": 1357.0,
            },
            "train_over_reference_step": 0.94,
            "train_over_full_step": 1.11,
            "aten_ops": {"ratio": 1.1},
        },
        {  # below: 0.52 of its reference
            "strategy": "gr4cil",
            "train_images_per_second": 709.0,
            "train_over_reference_step": 0.52,
            "train_over_full_step": 0.52,
        },
        {"strategy": "moe4cl"},  # every key missing: shown as "-", never a pass
        {"strategy": "l2p_pp", "train_images_per_second": 543.0},  # not a LoRA strategy: no goal
    ]
}
PIPELINE_ROWS = [
    {
        "strategy": "finetune",
        "train_images_per_second": 900.0,
        "eval_images_per_second": 4000.0,
        "reference_step_images_per_second": 1000.0,
        "reference_forward_images_per_second": 5000.0,
    }
]


def tiny_phases(**replace) -> list[Phase]:
    phases = {
        "tests": Phase(
            "tests",
            "CUDA tests",
            (_script("print('3 passed, 2 skipped in 0.10s')"),),
            0.25,
            gpu_check.read_tests,
        ),
        "speed": Phase("speed", "steps", (_writes("speed.json", SPEED_ROWS),), 0.25, gpu_check.read_speed),
        "pipeline": Phase(
            "pipeline", "runner", (_writes("pipeline.json", PIPELINE_ROWS),), 0.25, gpu_check.read_pipeline
        ),
        "fast dev run": Phase(
            "fast dev run",
            "every run",
            (_writes("fast-dev-run/cifar100/finetune/T2-seed0.json", {}),),
            0.25,
            gpu_check.read_fast_dev_run,
        ),
    }
    phases.update(replace)
    return list(phases.values())


def test_without_cuda_it_says_so_in_one_line_and_exits_2(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--out", str(tmp_path / "out")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "no CUDA device is visible" in err
    assert not (tmp_path / "out").exists()


def test_a_used_out_folder_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "table.md").write_text("an earlier check")
    assert gpu_check.main(["--device", "cpu", "--out", str(tmp_path / "out")], phases=tiny_phases()) == 2
    assert "exists and is not an empty folder" in capsys.readouterr().err
    assert (tmp_path / "out" / "table.md").read_text() == "an earlier check"


@pytest.mark.slow
def test_cpu_check_end_to_end_prints_one_table_and_a_verdict_and_keeps_everything(tmp_path, capsys):
    out = tmp_path / "check"
    assert gpu_check.main(["--device", "cpu", "--out", str(out)], phases=tiny_phases()) == 0
    printed = capsys.readouterr().out
    table, verdict = printed.strip().rsplit("\n\n", 1)
    lines = table.splitlines()
    assert lines[0] == "| phase | what | measured | goal | verdict |"
    rows = {tuple(cell.strip() for cell in line.strip("|").split("|")[:2]): line for line in lines[2:]}
    for phase in ("tests", "speed", "pipeline", "fast dev run"):
        assert any(key[0] == phase for key in rows), phase
    assert "3 passed, 2 skipped" in rows["tests", "CUDA tests"]
    assert (
        rows["speed", "finetune"].endswith("| pass |")
        and "0.94 x reference step (lora)" in rows["speed", "finetune"]
    )
    assert rows["speed", "gr4cil"].endswith("| below goal |")
    assert "- x reference step" in rows["speed", "moe4cl"] and rows["speed", "moe4cl"].endswith("| - |")
    assert rows["speed", "l2p_pp"].endswith("| - |")  # no goal for a prompt method
    # the pipeline's ratios computed from its rates where the ratio keys are missing: 0.9 and 0.8
    assert "0.90 x step" in rows["pipeline", "finetune"] and "0.80 x forward" in rows["pipeline", "finetune"]
    assert rows["pipeline", "finetune"].endswith("| pass |")
    assert "1 run(s) finished" in rows["fast dev run", "every run end to end"]
    assert verdict.startswith("verdict: runs, but 1 of 5 checks are below their speed goal")
    assert {p.name for p in out.iterdir()} >= {
        "speed.json",
        "pipeline.json",
        "table.md",
        "logs",
        "fast-dev-run",
    }
    assert {p.name for p in (out / "logs").iterdir()} == {
        f"{n}.log" for n in ("tests", "speed", "pipeline", "fast-dev-run")
    }
    assert (out / "table.md").read_text() == printed
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # the staging folder renamed


@pytest.mark.slow
def test_a_phase_that_fails_or_times_out_is_a_row_not_a_traceback(tmp_path, capsys):
    tiny = {phase.name: phase for phase in tiny_phases()}
    phases = [  # the sleeper first: its deadline is its share alone, under a second
        Phase("speed", "steps", (_script("import time; time.sleep(60)"),), 0.02, gpu_check.read_speed),
        Phase(
            "tests",
            "CUDA tests",
            (_script("import sys; print('boom'); sys.exit(3)"),),
            0.25,
            gpu_check.read_tests,
        ),
        Phase("pipeline", "runner", (_writes("pipeline.json", "not rows"),), 0.25, gpu_check.read_pipeline),
        tiny["fast dev run"],
    ]
    out = tmp_path / "check"
    # 0.05 min: the sleeping phase gets its share and what the phases before it left, a few seconds
    assert (
        gpu_check.main(["--device", "cpu", "--out", str(out), "--budget-minutes", "0.05"], phases=phases) == 1
    )
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    rows = [line for line in captured.out.splitlines() if line.startswith("| ") and "---" not in line][1:]
    by_phase = {line.split("|")[1].strip(): line for line in rows}
    assert by_phase["tests"].endswith("| failed |") and "failed (exit 3)" in by_phase["tests"]
    assert f"log: {out}/logs/tests.log" in by_phase["tests"]
    assert by_phase["speed"].endswith("| timed out |") and f"log: {out}/logs/speed.log" in by_phase["speed"]
    assert by_phase["pipeline"].endswith("| failed |") and "unreadable result" in by_phase["pipeline"]
    assert by_phase["fast dev run"].endswith("| pass |")  # the phases after a failure still run
    assert (
        captured.out.rstrip()
        .splitlines()[-1]
        .startswith("verdict: NOT READY: speed (timed out), tests (failed)")
    )
    assert "boom" in (out / "logs" / "tests.log").read_text()


# --- the dry run's GPU-hours ------------------------------------------------------------------------


def _dry_run(tmp_path, *extra) -> str:
    argv = ["--suite", "main", "--strategies", "gr4cil,finetune", "--datasets", "cifar100,imagenet_r"]
    argv += ["--seeds", "0", "--dry-run", "--results-dir", str(tmp_path / "runs" / "main"), *extra]
    assert run.main(argv) == 0
    return argv


def test_the_dry_run_turns_measured_rates_into_gpu_hours(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rates = tmp_path / "runs" / "gpu_check" / "2026-11-27" / "pipeline.json"
    rates.parent.mkdir(parents=True)
    rows = [
        {"strategy": "gr4cil", "train_images_per_second": 400, "eval_images_per_second": 50},
        {"strategy": "finetune", "train_images_per_second": 500, "eval_images_per_second": 100},
    ]
    rates.write_text(json.dumps({"model": "ViT-B-16-quickgelu", "rows": rows}))
    _dry_run(tmp_path)  # found by itself, beside runs/main
    table, line = capsys.readouterr().out.strip().rsplit("\n", 1)
    # By hand: both strategies train 70 epochs; CIFAR-100 50,000 / 10,000 images, ImageNet-R (RAPF)
    # 24,000 / 6,000; each of the 10 stages scores the whole test set (future classes too).
    train = 70 * (50_000 + 24_000) / 400 + 70 * (50_000 + 24_000) / 500  # 12,950 + 10,360 s
    evaluation = 10 * (10_000 + 6_000) / 50 + 10 * (10_000 + 6_000) / 100  # 3,200 + 1,600 s
    assert (train, evaluation) == (23_310, 4_800)
    expected = (
        f"{(train + evaluation) / 3600:.1f} (training {train / 3600:.1f}, evaluation {evaluation / 3600:.1f})"
    )
    assert expected == "7.8 (training 6.5, evaluation 1.3)"
    assert line == (
        f"GPU-hours expected at the rates of {rates}: {expected} for 4 of 4 run(s) left, "
        "one GPU a run, second stages not counted"
    )
    assert "4 run(s), 4 left to run" in table  # the table as it was

    other = tmp_path / "mine.json"
    other.write_text(json.dumps(rows[:1]))  # a plain list of rows; finetune unmeasured
    _dry_run(tmp_path, "--rates", str(other))
    line = capsys.readouterr().out.strip().rsplit("\n", 1)[1]
    assert f"{(12_950 + 3_200) / 3600:.1f} (training {12_950 / 3600:.1f}" in line
    assert line.endswith(
        "for 2 of 4 run(s) left, one GPU a run, second stages not counted; 2 run(s) without an "
        "estimate (no rate measured for finetune)"
    )


def test_without_a_check_the_dry_run_uses_the_stored_reference_rates_and_says_whose(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    _dry_run(tmp_path)
    line = capsys.readouterr().out.strip().rsplit("\n", 1)[1]
    # By hand, at the H100's rates (finetune 585, GR4CIL 426 images/s training, both 900 evaluating):
    # 70 epochs of 74,000 training images each, 10 stages of 16,000 test images each, per strategy
    train = 70 * 74_000 / 426 + 70 * 74_000 / 585  # 12,159.6 + 8,854.7 s
    evaluation = 2 * 10 * 16_000 / 900  # 355.6 s
    assert (
        f"{(train + evaluation) / 3600:.1f} (training {train / 3600:.1f}, evaluation {evaluation / 3600:.1f})"
        == ("5.9 (training 5.8, evaluation 0.1)")
    )
    assert line == (
        "GPU-hours expected at the reference rates of an NVIDIA H100 (fp16, 8 loader workers, commit "
        "0f299aa; gpu_reference_rates.json), not of your card: 5.9 (training 5.8, evaluation 0.1) for 4 "
        "of 4 run(s) left, one GPU a run, second stages not counted; for your card's own: "
        "python -m benchmarks.tools.gpu_check"
    )
    assert run.main(["--suite", "main", "--dry-run", "--rates", str(tmp_path / "nothing.json")]) == 2
    assert "--rates" in capsys.readouterr().err


@pytest.mark.slow  # the fake data in the real layouts
def test_the_dry_run_names_what_the_runs_read_and_the_command_that_brings_it(
    tmp_path, capsys, monkeypatch, fake_root
):
    from huggingface_hub import constants as hub

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # an empty open_clip cache
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    _dry_run(tmp_path)
    out = capsys.readouterr().out
    assert (
        "What the runs read:\n"
        "- data cifar100: missing; python -m benchmarks.prepare cifar100 --data-root data\n"
        "- data imagenet_r: missing; python -m benchmarks.prepare imagenet_r --data-root data\n"
        "- weights ViT-B-16-quickgelu/openai: missing; python -m benchmarks.prepare weights\n"
    ) in out
    _dry_run(tmp_path, "--data-root", str(fake_root))  # fake data in the real layouts
    out = capsys.readouterr().out
    assert f"- data imagenet_r: present ({fake_root / 'imagenet-r'})\n" in out
    # CIFAR-100's pickles are checked against the official MD5s, which fake ones fail
    assert (
        "- data cifar100: corrupt: train fails its MD5 check; python -m benchmarks.prepare cifar100 "
        f"--data-root {fake_root}\n"
    ) in out


def test_strategies_the_pipeline_did_not_run_get_its_rates_scaled_by_the_speed_table(
    tmp_path, capsys, monkeypatch
):
    """On CUDA the pipeline phase runs fine-tuning alone; GR4CIL's runner rates are fine-tuning's
    times GR4CIL's / fine-tuning's speed in the same check's speed table."""
    monkeypatch.chdir(tmp_path)
    check = tmp_path / "runs" / "gpu_check" / "2026-11-27"
    check.mkdir(parents=True)
    pipeline = [{"strategy": "finetune", "train_images_per_second": 500, "eval_images_per_second": 100}]
    (check / "pipeline.json").write_text(json.dumps({"rows": pipeline}))
    speed = [
        {"strategy": "finetune", "train_images_per_second": 250.0, "eval_images_per_second": 40.0},
        {"strategy": "gr4cil", "train_images_per_second": 200.0, "eval_images_per_second": 20.0},
        {"strategy": "l2p_pp", "train_images_per_second": None, "eval_images_per_second": 30.0},
    ]
    (check / "speed.json").write_text(json.dumps({"rows": speed}))
    _dry_run(tmp_path)
    line = capsys.readouterr().out.strip().rsplit("\n", 1)[1]
    # By hand: gr4cil trains at 500 x 200 / 250 = 400 and evaluates at 100 x 20 / 40 = 50 images/s,
    # the rates of the first test, so the hours are the same: 7.8 (training 6.5, evaluation 1.3).
    assert "7.8 (training 6.5, evaluation 1.3) for 4 of 4 run(s) left" in line
    assert line.endswith("(2 at runner rates scaled from the speed table's)")
    from benchmarks.runner.gpu_hours import read_rates

    rates = read_rates(check / "pipeline.json")
    assert rates.scaled == {"gr4cil"} and "l2p_pp" not in rates.train  # no training rate: none made up
