"""``benchmarks.tools.kill_rerun``: what a trial checks (results equal but for where and when they
ran, no temp, lock or checkpoint left, no process alive), a bad input in one line, and one trial
end to end on a one-run suite."""

import json
import subprocess
import sys

import pytest

from benchmarks.tools import kill_rerun


def _result(folder, name="finetune/T2-seed0.json", **fields):
    path = folder / "synthetic" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "stages": [{"acc": 50.0}],
        "summary": {"last_acc": 50.0},
        "env": {"host": "a"},
        "cost": {"s": 1},
    }
    path.write_text(json.dumps({**record, **fields}))
    return path


def test_results_compare_without_where_and_when_and_strays_are_temps_locks_and_checkpoints(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _result(a)
    _result(b, env={"host": "b"}, cost={"s": 9})  # another machine and time: the same result
    assert kill_rerun._finished(a) == kill_rerun._finished(b)
    _result(b, summary={"last_acc": 99.0})
    assert kill_rerun._finished(a) != kill_rerun._finished(b)
    (a / "synthetic" / "finetune" / "T2-seed0.predictions.safetensors").write_bytes(b"x")
    assert "synthetic/finetune/T2-seed0.predictions.safetensors" in kill_rerun._finished(a)
    assert kill_rerun._strays(a) == []
    for stray in (".T2-seed0.json.host-1.ab.tmp", "T2-seed0.lock"):
        (a / "synthetic" / "finetune" / stray).write_text("")
    (a / ".checkpoints" / "x").mkdir(parents=True)
    (a / ".checkpoints" / "x" / "state.json").write_text("{}")
    assert kill_rerun._strays(a) == [
        ".checkpoints/x/state.json",
        "synthetic/finetune/.T2-seed0.json.host-1.ab.tmp",
        "synthetic/finetune/T2-seed0.lock",
    ]


def test_only_running_processes_count_as_left_alive():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert kill_rerun._alive([sleeper.pid]) == [sleeper.pid]
    finally:
        sleeper.kill()
        sleeper.wait()
    assert kill_rerun._alive([sleeper.pid]) == []


def test_a_bad_count_is_one_line(capsys):
    assert kill_rerun.main(["--kills", "0"]) == 2
    assert capsys.readouterr().err.strip() == "error: --kills must be at least 1, not 0"


@pytest.mark.slow
def test_one_kill_and_rerun_end_to_end(monkeypatch, capsys, tmp_path):
    """A one-run suite (fine-tuning, 2 tasks, inline): killed once, rerun, identical and clean."""
    suite = kill_rerun.SUITE.replace('strategies = ["finetune", "gr4cil"]', 'strategies = ["finetune"]')
    suite = suite.replace("tasks = [4]", "tasks = [2]").replace("workers = 2", "workers = 1")
    monkeypatch.setattr(kill_rerun, "SUITE", suite)
    code = kill_rerun.main(["--kills", "1", "--seed", "3", "--out", str(tmp_path / "trials.json")])
    out = capsys.readouterr().out
    (trial,) = json.loads((tmp_path / "trials.json").read_text())["trials"]
    assert code == 0, out
    # the kill falls within the uninterrupted run's time; a rerun warmer than it may have ended first
    if trial["killed"]:
        assert trial["ok"] and out.strip().splitlines()[-1] == (
            "1 of 1 killed runs identical and clean (0 not killed)"
        )


@pytest.mark.parametrize("value", ["-5", "0", "nan", "inf", "soon"])
def test_a_timeout_that_is_no_positive_number_is_one_line(capsys, value):
    with pytest.raises(SystemExit) as stop:
        kill_rerun.main(["--timeout", value])
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: argument --timeout: ") and "--help" in line


def test_a_suite_past_its_timeout_is_one_line_and_leaves_no_process(capsys, tmp_path, monkeypatch):
    """``--timeout 0.5``: the uninterrupted run is stopped, its whole process group with it."""
    started = []
    popen = kill_rerun.subprocess.Popen

    def recorded(*args, **kwargs):
        started.append(process := popen(*args, **kwargs))
        return process

    monkeypatch.setattr(kill_rerun.subprocess, "Popen", recorded)
    assert kill_rerun.main(["--kills", "1", "--timeout", "0.5"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        "error: the suite did not finish within --timeout 0.5 s; give a longer --timeout (the seconds "
        "one run of the suite to its end may take)"
    )
    (process,) = started
    assert process.returncode is not None and kill_rerun._alive([process.pid]) == []


@pytest.mark.parametrize("where", ["a folder", "under a file"])
def test_an_out_it_could_not_write_is_refused_before_any_trial(capsys, tmp_path, monkeypatch, where):
    monkeypatch.setattr(kill_rerun, "_run", lambda *a: pytest.fail("a run started before --out was checked"))
    (tmp_path / "file").write_text("")
    out = tmp_path if where == "a folder" else tmp_path / "file" / "trials.json"
    assert kill_rerun.main(["--kills", "1", "--out", str(out)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    said = "is a folder" if where == "a folder" else f"lies under {tmp_path / 'file'}, which is a file"
    assert line.startswith(f"error: --out {out} {said}")
