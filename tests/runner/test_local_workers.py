"""How many local workers a command starts (``--workers``, a suite's ``workers``), their threads,
and which launcher the command picks from them (``benchmarks.run``)."""

import pytest

from benchmarks import run, run_suite
from benchmarks.core.errors import UserError
from benchmarks.runner import local_launcher
from benchmarks.runner.local_launcher import auto_workers, check_workers, worker_threads
from benchmarks.runner.reading import iter_results
from tests.helpers import three_task_suite


@pytest.mark.parametrize("value, expected", [("auto", "auto"), (2, 2), ("3", 3)])
def test_workers_are_a_whole_number_or_auto(value, expected):
    assert check_workers(value) == expected


@pytest.mark.parametrize("value", [0, -1, "0", "many", True, 1.5])
def test_other_workers_are_one_line(value):
    with pytest.raises(UserError, match=r'workers must be a whole number >= 1 or "auto"'):
        check_workers(value)


def test_auto_is_a_worker_an_idle_core_on_the_cpu_one_on_cuda_and_never_more_than_the_runs(monkeypatch):
    monkeypatch.setattr(local_launcher, "idle_cores", lambda: 4)
    assert auto_workers("auto", "cpu", 10) == 4
    assert auto_workers("auto", "cpu", 3) == 3
    assert auto_workers("auto", "cuda", 10) == 1
    assert auto_workers(6, "cpu", 2) == 2 and auto_workers(6, "cuda", 8) == 6
    assert auto_workers("auto", "cpu", 0) == 1
    monkeypatch.setattr(local_launcher, "idle_cores", lambda: 0)  # another process keeps every core busy
    assert auto_workers("auto", "cpu", 10) == 1


def test_idle_cores_sum_the_idle_share_of_the_usable_cores(monkeypatch):
    import psutil

    from benchmarks.core import environment

    monkeypatch.setattr(psutil, "cpu_percent", lambda interval, percpu: [100.0, 0.0, 40.0, 30.0, 0.0])
    monkeypatch.setattr(environment.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert environment.idle_cores() == 2  # 0 + 1 + 0.6 + 0.7 on cores 0-3; core 4 is not ours
    assert 0 <= environment.idle_cores(0.1) <= 4  # a real sample


def test_workers_keep_auto_threads_where_auto_gives_each_its_share(monkeypatch):
    from benchmarks.core import environment

    monkeypatch.setattr(environment, "usable_cores", lambda: 8)
    assert worker_threads("auto", 4, "cpu") == "auto"  # one thread each, what "auto" gives on the CPU
    assert worker_threads("auto", 1, "cuda") == "auto"
    assert worker_threads("auto", 2, "cuda") == 4  # the cores shared out among the GPUs' workers
    assert worker_threads(3, 2, "cpu") == 3


def _suite(tmp_path, workers: str):
    path = tmp_path / "suite.toml"
    text = three_task_suite("continual_clip", "").replace("seeds = [0]", "seeds = [0, 1]")
    path.write_text(text.replace('device = "cpu"', f'device = "cpu"\nworkers = {workers}'))
    return path


def _args(*argv):
    return run.parse_args(["--suite", "x", *argv])


@pytest.mark.parametrize(
    "argv, workers, expected",
    [
        ([], 2, "local"),  # the suite's workers, resolved
        ([], 1, "inline"),  # one idle core, or one run: nothing to share
        (["--launcher", "inline"], 2, "inline"),  # the command's launcher wins
        (["--force"], 2, "inline"),  # the local launcher refuses --force
        (["--workers", "1"], 1, "local"),  # --workers names the local launcher
    ],
)
def test_the_launcher_follows_the_command_then_the_suites_workers(argv, workers, expected):
    args = _args(*argv)
    assert run_suite._launcher_for_runs(run_suite._named_launcher(args), workers, args.force) == expected


def test_a_bad_workers_value_in_a_suite_is_one_line_and_runs_nothing(tmp_path, capsys):
    suite = _suite(tmp_path, '"many"')
    assert run.main(["--suite", str(suite), "--results-dir", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: workers must be a whole number >= 1 or \"auto\", not 'many'"]
    assert not list(iter_results(tmp_path / "results"))


def test_force_with_the_suites_workers_recomputes_inline(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(local_launcher, "idle_cores", lambda: 2)
    suite, results = _suite(tmp_path, '"auto"'), tmp_path / "results"
    argv = ["--suite", str(suite), "--results-dir", str(results), "--launcher", "inline"]
    assert run.main(argv) == 0
    capsys.readouterr()
    assert run.main(["--suite", str(suite), "--results-dir", str(results), "--force"]) == 0
    err = capsys.readouterr().err
    assert err.count(": ran; Avg ") == 2 and "local worker" not in err
    assert not (results / ".logs").exists()  # no worker was started
