"""Progress across a suite (``benchmarks.runner.suite_progress``): the estimate of the time left
against hand computations, the reasons for one run at a time or several, and the lines a real
command writes (run k of N, the closing total)."""

import pytest

from benchmarks import run
from benchmarks.runner import suite_progress
from benchmarks.runner.suite_progress import SuiteProgress, duration, why_workers
from benchmarks.runner.suites import expand, load_suite
from tests.helpers import three_task_suite, tiny_suite


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(suite_progress.time, "monotonic", clock)
    return clock


def four_runs(tmp_path):
    """finetune and continual_clip, seeds 0 and 1, in the suite's order."""
    path = tmp_path / "four.toml"
    path.write_text(tiny_suite(["finetune", "continual_clip"], tasks=3, seeds=(0, 1)))
    runs = expand(load_suite(str(path)))
    assert [(s.strategy, s.seed) for s in runs] == [
        ("finetune", 0),
        ("finetune", 1),
        ("continual_clip", 0),
        ("continual_clip", 1),
    ]
    return runs


def test_durations_read_as_a_person_writes_them():
    assert [duration(s) for s in (0.4, 42, 89, 90, 3599, 3600, 7500)] == [
        "0 s",
        "42 s",
        "1 min",
        "2 min",
        "1 h 00 min",  # 59.98 minutes round to an hour
        "1 h 00 min",
        "2 h 05 min",
    ]


def test_the_estimate_is_each_runs_kind_mean_else_the_overall_mean(tmp_path, clock):
    finetune0, finetune1, clip0, clip1 = four_runs(tmp_path)
    progress = SuiteProgress([finetune0, finetune1, clip0, clip1])
    assert progress.left() is None  # nothing computed: no estimate
    clock.now += 5
    assert progress.ended(clip0, None) == "run 1 of 4, 5 s so far"  # found finished: no time learnt
    clock.now += 100
    # finetune took 100 s: finetune1 100 s and clip1 100 s (the overall mean, as no continual_clip
    # run was timed: a lower bound): 200 s left
    assert progress.ended(finetune0, 100.0) == "run 2 of 4, 2 min so far, at least 3 min left"
    assert progress.left() == 200.0
    progress.seconds[str(clip0.key)] = 20.0  # a continual_clip run of 20 s: its own kind's mean
    assert progress.left() == 100.0 + 20.0
    clock.now += 10
    assert progress.ended(finetune1, 140.0) == "run 3 of 4, 2 min so far, about 20 s left"
    assert progress.ended(clip1, 22.0) == "run 4 of 4, 2 min so far"  # nothing left: no estimate


def test_workers_share_the_time_left(tmp_path, clock):
    finetune0, finetune1, clip0, clip1 = four_runs(tmp_path)
    progress = SuiteProgress([finetune0, finetune1, clip0, clip1], workers=2)
    progress.ended(finetune0, 60.0)
    assert progress.left() == 3 * 60.0 / 2


def test_the_reason_for_one_run_at_a_time_or_several():
    assert why_workers(2, "auto", None, "cpu", 2, 10) == (
        "2 runs at once in local worker processes (workers = auto: one per idle core, 2 idle)"
    )
    assert why_workers(1, "auto", None, "cpu", 1, 10) == (
        "one run at a time (workers = auto: one per idle core, 1 idle)"
    )
    assert why_workers(3, "auto", None, "cpu", 8, 3) == (
        "3 runs at once in local worker processes (workers = auto: one per idle core, 8 idle, capped by "
        "the 3 run(s))"
    )
    assert why_workers(1, "auto", None, "cpu", 0, 10) == (
        "one run at a time (workers = auto: no core is idle now (other processes keep them busy), so one)"
    )
    assert why_workers(1, "auto", None, "cuda", None, 10) == (
        "one run at a time (workers = auto: one on cuda; --workers N or --gpus to run more)"
    )
    assert why_workers(1, 1, None, "cpu", None, 10).startswith("one run at a time (workers = 1; --workers N")
    assert why_workers(1, 4, "inline", "cpu", None, 10) == "one run at a time (--launcher inline)"
    assert (
        why_workers(4, 4, "local", "cpu", None, 10)
        == "4 runs at once in local worker processes (workers = 4)"
    )


@pytest.mark.slow
def test_a_command_says_why_where_it_stands_and_what_it_took(tmp_path, capsys):
    suite = tmp_path / "suite.toml"
    suite.write_text(three_task_suite("continual_clip", "").replace("seeds = [0]", "seeds = [0, 1]"))
    argv = ["--suite", str(suite), "--results-dir", str(tmp_path / "results"), "--launcher", "inline"]
    assert run.main(argv) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].endswith(
        "2 run(s) -> " + str(tmp_path / "results") + "; one run at a time (--launcher inline)"
    )
    ended = [line for line in err if ": ran; Avg " in line]
    assert len(ended) == 2
    assert "(run 1 of 2, " in ended[0] and ended[0].endswith(" left)")  # one computed: an estimate
    assert "(run 2 of 2, " in ended[1] and ended[1].endswith(" so far)")  # nothing left
    assert err[-1].startswith(f"suite 'suite' ({suite}): 2 of 2 run(s) finished in ")
    assert run.main(argv) == 0
    err = capsys.readouterr().err.splitlines()
    assert sum(": cached; Avg " in line and "(run " in line for line in err) == 2
    assert err[-1].startswith(f"suite 'suite' ({suite}): 2 of 2 run(s) finished in ")
