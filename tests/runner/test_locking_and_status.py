"""Run locks (exclusive, heartbeat, stale takeover), runners sharing a results folder, and the
views of a sweep: ``benchmarks.runner.status`` and ``benchmarks.run --dry-run``."""

import errno
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import run, run_suite
from benchmarks.core.heartbeat_lock import read_holder
from benchmarks.runner import status
from benchmarks.runner.locking import RunLock
from benchmarks.runner.reading import iter_results
from benchmarks.runner.results import ResultStore, RunKey
from strategies.methods.finetune import Finetune
from tests.helpers import kill_in_task, runner_command, three_task_suite

KEY = RunKey("finetune", "synthetic", 3, 0)
SUITE = three_task_suite("finetune", "epochs = 1\nbatch_size = 40\neval_batch_size = 100\nlora_rank = 2")
ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.spread  # each case on any worker: no module fixture


def _write_lock(path: Path, host: str, pid: int, age: float = 0.0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"host": host, "pid": pid, "job_id": None, "since": time.time() - age, "token": "x"})
    )
    os.utime(path, (time.time() - age, time.time() - age))


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_lock_is_exclusive_until_released(tmp_path):
    first, second = RunLock(tmp_path / "run.lock"), RunLock(tmp_path / "run.lock")
    assert first.acquire() and not second.acquire()
    holder = read_holder(first.path)
    assert holder.host == socket.gethostname() and holder.pid == os.getpid()
    assert f"pid {os.getpid()}" in holder.describe()
    first.release()
    assert not first.path.exists() and second.acquire()
    second.release()


def test_stale_locks_are_taken_over_and_live_ones_are_not(tmp_path):
    path = tmp_path / "run.lock"
    _write_lock(path, socket.gethostname(), _dead_pid())  # its process is gone from this host
    lock = RunLock(path)
    assert lock.acquire() and lock.took_over is not None
    lock.release()
    _write_lock(path, "another-node", 12345, age=10)  # another machine, heartbeat 10 s ago: alive
    assert not RunLock(path).acquire()
    _write_lock(path, "another-node", 12345, age=3600)  # no heartbeat for an hour: stale
    lock = RunLock(path)
    assert lock.acquire() and lock.took_over.host == "another-node"
    lock.release()


def test_the_heartbeat_refreshes_the_lock(tmp_path):
    lock = RunLock(tmp_path / "run.lock", heartbeat=0.05)
    assert lock.acquire()
    os.utime(lock.path, (0, 0))
    time.sleep(0.3)
    assert time.time() - lock.path.stat().st_mtime < 5
    lock.release()


@pytest.mark.parametrize(
    "where", ["writing the lock file", "as the lock's name is made", "starting the heartbeat"]
)
def test_a_signal_during_the_acquisition_leaves_no_lock_behind(tmp_path, monkeypatch, where):
    """SIGTERM raises in the main thread (``stop_on_sigterm``) as any call returns: in the middle of
    the new lock's JSON, the instant its name exists, or once it is whole; whichever, no file of this
    process remains. (The lock was once created empty and then written: a signal landing as the
    creating call returned left an empty lock that nobody removed, and a local launcher's worker
    killed with its launcher left one, tests/runner/test_locks_and_workers.py.)"""
    from benchmarks.core import heartbeat_lock

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    link = os.link

    def linked_then_interrupted(*args, **kwargs):
        link(*args, **kwargs)
        raise KeyboardInterrupt

    if where == "writing the lock file":
        monkeypatch.setattr(heartbeat_lock.json, "dump", interrupted)
    elif where == "as the lock's name is made":
        monkeypatch.setattr(heartbeat_lock.os, "link", linked_then_interrupted)
    else:
        monkeypatch.setattr(heartbeat_lock.HeartbeatLock, "_start_heartbeat", interrupted)
    lock = RunLock(tmp_path / "run.lock")
    with pytest.raises(KeyboardInterrupt):
        lock.acquire()
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == [] and lock._thread is None
    assert RunLock(lock.path).acquire()  # free for the next command at once, not after going stale


@pytest.mark.parametrize("refusal", [errno.EPERM, errno.EOPNOTSUPP])
def test_a_file_system_without_hard_links_gets_an_exclusive_create(tmp_path, monkeypatch, refusal):
    """FAT, some FUSE and object-store mounts refuse ``link``: the lock is still exclusive."""
    from benchmarks.core import heartbeat_lock

    def refused(*args, **kwargs):
        raise OSError(refusal, os.strerror(refusal))

    monkeypatch.setattr(heartbeat_lock.os, "link", refused)
    first, second = RunLock(tmp_path / "run.lock"), RunLock(tmp_path / "run.lock")
    assert first.acquire() and not second.acquire()
    assert read_holder(first.path).pid == os.getpid()
    first.release()
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_a_link_answered_exists_for_this_lock_itself_is_taken(tmp_path, monkeypatch):
    """NFS can answer a retried ``link`` "exists" when its first try made the lock: the lock holds
    this process's token, so it is this process's, not another's."""
    from benchmarks.core import heartbeat_lock

    link = os.link

    def linked_then_exists(*args, **kwargs):
        link(*args, **kwargs)
        raise FileExistsError(errno.EEXIST, "File exists")

    monkeypatch.setattr(heartbeat_lock.os, "link", linked_then_exists)
    lock = RunLock(tmp_path / "run.lock")
    assert lock.acquire() and not RunLock(lock.path).acquire()
    lock.release()
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_acquisition_leaves_another_holders_lock_alone(tmp_path, monkeypatch):
    from benchmarks.core import heartbeat_lock

    path = tmp_path / "run.lock"
    _write_lock(path, "another-node", 4242)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(heartbeat_lock, "read_holder", interrupted)
    with pytest.raises(KeyboardInterrupt):
        RunLock(path).acquire()
    assert json.loads(path.read_text())["pid"] == 4242


def test_a_signal_as_the_lock_is_taken_releases_it(tmp_path, monkeypatch):
    """The SIGTERM a killed launcher sends its workers can land just as ``acquire`` returns: the
    runner still releases the lock, so the rerun finds the run free (the local launcher's kill -9
    case, tests/runner/test_locks_and_workers.py, once left a worker's lock there)."""
    real = RunLock.acquire

    def taken_then_interrupted(self):
        assert real(self) and self.path.exists()
        raise KeyboardInterrupt

    monkeypatch.setattr(RunLock, "acquire", taken_then_interrupted)
    assert _run(tmp_path) == 130
    store = ResultStore(tmp_path / "results")
    assert not store.lock(KEY).path.exists() and not store.lock(KEY).error_path.exists()
    monkeypatch.undo()
    assert _run(tmp_path) == 0 and status.run_state(store, KEY).state == "finished"


def _run(tmp_path, *extra):
    suite = tmp_path / "suite.toml"
    suite.write_text(SUITE)
    return run.main(["--suite", str(suite), "--results-dir", str(tmp_path / "results"), "--quiet", *extra])


def test_a_runner_skips_a_run_another_process_holds(tmp_path, capsys):
    store = ResultStore(tmp_path / "results")
    _write_lock(store.lock(KEY).path, "another-node", 4242)
    assert _run(tmp_path) == 0
    err = capsys.readouterr().err
    assert "computed by another command (another-node, pid 4242, since" in err
    assert list(iter_results(store.root)) == []
    assert status.run_state(store, KEY).state == "running"


def test_a_failed_run_releases_its_lock_records_its_error_and_a_success_clears_it(
    tmp_path, monkeypatch, capsys
):
    real_loss = Finetune.compute_loss
    monkeypatch.setattr(
        Finetune,
        "compute_loss",
        lambda self, logits, t: real_loss(self, logits, t) * (float("nan") if self.task_classes else 1.0),
    )
    assert _run(tmp_path) == 2
    store = ResultStore(tmp_path / "results")
    assert not store.lock(KEY).path.exists()
    state = status.run_state(store, KEY)
    assert (
        state.state == "failed"
        and "loss became nan in epoch 1" in state.detail
        and "1/3 tasks kept" in state.detail
    )
    capsys.readouterr()
    assert status.main(["--results-dir", str(store.root)]) == 0
    assert (
        "| finetune / synthetic / 3 tasks / seed 0 | failed | finetune / synthetic" in capsys.readouterr().out
    )
    monkeypatch.setattr(Finetune, "compute_loss", real_loss)
    assert _run(tmp_path) == 0
    assert status.run_state(store, KEY).state == "finished" and not store.lock(KEY).error_path.exists()


def test_dry_run_lists_states_and_estimates_from_finished_runs(tmp_path, monkeypatch, capsys):
    assert _run(tmp_path) == 0  # seed 0 finished
    revive = kill_in_task(monkeypatch, Finetune, task=3)
    assert _run(tmp_path, "--seeds", "1") == 130  # seed 1: 2 of 3 tasks
    revive()
    capsys.readouterr()
    assert _run(tmp_path, "--seeds", "0,1,2", "--dry-run") == 0
    out = capsys.readouterr().out
    rows = {
        line.split(" | ")[0].strip("| "): line for line in out.splitlines() if line.startswith("| finetune")
    }
    assert "| finished (Avg" in rows["finetune / synthetic / 3 tasks / seed 0"]
    assert "| partial (2/3 tasks done) |" in rows["finetune / synthetic / 3 tasks / seed 1"]
    assert "| to run |" in rows["finetune / synthetic / 3 tasks / seed 2"]
    assert "estimated" in out and "without an estimate" not in out
    assert len(list(iter_results(tmp_path / "results"))) == 1  # nothing ran


def _dry_run_summary(tmp_path, capsys, *extra) -> str:
    capsys.readouterr()
    assert _run(tmp_path, "--dry-run", *extra) == 0
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_dry_run_says_when_nothing_or_not_everything_has_an_estimate(tmp_path, capsys):
    both = ("--strategies", "finetune,continual_clip")
    assert _dry_run_summary(tmp_path, capsys, *both) == (
        "2 run(s), 2 left to run; no estimate yet (no finished run of these strategies and datasets)"
    )
    # a finished finetune run of 10 tasks (the committed smoke one), its cost set to 10 s a task:
    # 30 s a run of 3 tasks; continual_clip has none
    store = ResultStore(tmp_path / "results")
    other = RunKey("finetune", "synthetic", 10, 0)
    store.result_path(other).parent.mkdir(parents=True)
    stored = ROOT / "results" / "smoke-baselines" / "synthetic" / "finetune" / "T10-seed0.json"
    record = json.loads(stored.read_text())
    record["cost"].update(train_seconds=80.0, eval_seconds=20.0)
    store.result_path(other).write_text(json.dumps(record))
    assert _dry_run_summary(tmp_path, capsys, *both) == (
        "2 run(s); at least 30 s left, plus 1 run(s) without an estimate"
    )
    assert _dry_run_summary(tmp_path, capsys, "--strategies", "finetune") == "1 run(s); estimated 30 s left"


OUTSIDE = "strategies.methods.finetune:Finetune"  # named as module:Class, as a strategy from outside is


def test_an_outside_strategys_run_lives_under_its_safe_label_and_resumes(tmp_path, monkeypatch, capsys):
    """The colon of module:Class stays out of every path (results, checkpoints, locks); the run is
    found again on resume and by the status, and its JSON keeps the label itself."""
    suite = tmp_path / "suite.toml"
    suite.write_text(SUITE.replace('"finetune"', f'"{OUTSIDE}"').replace(".finetune]", f'."{OUTSIDE}"]'))
    argv = ["--suite", str(suite), "--results-dir", str(tmp_path / "results"), "--quiet"]
    store, key = ResultStore(tmp_path / "results"), RunKey(OUTSIDE, "synthetic", 3, 0)
    revive = kill_in_task(monkeypatch, Finetune, task=2)
    assert run.main(argv) == 130
    revive()
    folder = "strategies.methods.finetune_Finetune"
    assert (store.root / ".checkpoints" / "synthetic" / folder / "T3-seed0" / "state.json").exists()
    assert status.run_state(store, key).detail == "1/3 tasks done"
    assert status.known_runs(store) == [RunKey(folder, "synthetic", 3, 0)]  # no result yet names the label
    capsys.readouterr()
    assert run.main(argv) == 0
    err = capsys.readouterr().err
    assert "run(s) ->" not in err  # --quiet: no start line (tests/runner/test_command_input.py)
    assert run_suite.suite_title(run_suite.load_suite(str(suite))) == f"suite 'suite' ({suite})"
    assert f"{key}: resumed after task 1" in err
    (path, result), *others = list(iter_results(store.root))
    assert not others and path == store.root / "synthetic" / folder / "T3-seed0.json"
    assert (result["label"], result["strategy"]) == (OUTSIDE, OUTSIDE)
    assert (path.parent / result["predictions"]["file"]).exists()
    assert not [p for p in store.root.rglob("*") if ":" in p.name]
    assert status.known_runs(store) == [key] and status.run_state(store, key).state == "finished"
    assert status.main(["--results-dir", str(store.root)]) == 0
    assert f"| {key} | finished | Avg" in capsys.readouterr().out
    assert run.main(argv) == 0 and f"{key}: cached" in capsys.readouterr().err


def test_a_shipped_suite_is_named_without_its_path(tmp_path):
    assert run_suite.suite_title(run_suite.load_suite("smoke")) == "suite 'smoke'"
    path = tmp_path / "suite.toml"
    path.write_text(SUITE)
    assert run_suite.suite_title(run_suite.load_suite(str(path))) == f"suite 'suite' ({path})"


def test_status_of_an_empty_or_missing_folder_is_one_line(tmp_path, capsys):
    assert status.main(["--results-dir", str(tmp_path / "missing")]) == 2
    assert status.main(["--results-dir", str(tmp_path)]) == 2
    assert all(line.startswith("error: ") for line in capsys.readouterr().err.splitlines())


@pytest.mark.slow
def test_two_runners_started_together_compute_each_run_once(tmp_path):
    suite = tmp_path / "mini.toml"
    suite.write_text(
        SUITE.replace('strategies = ["finetune"]', 'strategies = ["continual_clip", "finetune"]').replace(
            "seeds = [0]", "seeds = [0, 1]"
        )
    )
    command = runner_command(suite, tmp_path / "results")
    runners = [
        subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [runner.communicate(timeout=600) for runner in runners]
    assert all(runner.returncode == 0 for runner in runners), outputs
    ran = [line for _, err in outputs for line in err.splitlines() if ": ran;" in line]
    assert len(ran) == 4 and len(set(line.split(":")[0] for line in ran)) == 4  # each run computed once
    results = [r for _, r in iter_results(tmp_path / "results")]
    assert len(results) == 4 and not list((tmp_path / "results" / ".locks").rglob("*.lock"))


def _suite_of_four(tmp_path) -> Path:
    suite = tmp_path / "four.toml"
    suite.write_text(
        SUITE.replace('strategies = ["finetune"]', 'strategies = ["continual_clip", "finetune"]').replace(
            "seeds = [0]", "seeds = [0, 1]"
        )
    )
    return suite


@pytest.mark.slow
def test_a_suites_workers_auto_runs_one_worker_a_core_with_the_inline_results(tmp_path, capsys, monkeypatch):
    """``workers = "auto"`` (the smoke suite's) on 2 idle cores: the local launcher with two workers,
    a line per run as it ends (stderr is a log here), the inline results; a rerun starts no worker."""
    from benchmarks.runner import local_launcher

    monkeypatch.setattr(local_launcher, "idle_cores", lambda: 2)
    suite = _suite_of_four(tmp_path)
    inline, local = tmp_path / "inline", tmp_path / "local"
    assert run.main(["--suite", str(suite), "--results-dir", str(inline), "--launcher", "inline"]) == 0
    capsys.readouterr()
    suite.write_text(suite.read_text().replace('device = "cpu"', 'device = "cpu"\nworkers = "auto"'))
    assert run.main(["--suite", str(suite), "--results-dir", str(local)]) == 0
    out, err = capsys.readouterr()
    assert out.count("| continual_clip |") == 1 and out.count("| finetune |") == 1
    assert "n = 2 seeds in every cell" in out  # the table has every run the workers finished
    assert "2 local worker(s) share 4 run(s)" in err
    ran = [line for line in err.splitlines() if ": ran; Avg " in line]
    assert len(ran) == 4 and "\r" not in err  # one line per run, no bar redrawn in a log
    expected = {str(p.relative_to(inline)): r["stages"] for p, r in iter_results(inline)}
    got = {str(p.relative_to(local)): r for p, r in iter_results(local)}
    assert {path: r["stages"] for path, r in got.items()} == expected and len(got) == 4
    # each worker ran at the command's --threads auto (one thread on the CPU), recorded as such
    assert {(r["env"]["threads_setting"], r["env"]["torch_threads"]) for r in got.values()} == {("auto", 1)}
    logs = sorted(str(p.relative_to(local / ".logs")) for p in (local / ".logs").rglob("*.log"))
    assert "synthetic/finetune/T3-seed1.log" in logs
    assert [log.split(".")[0] for log in logs if log.startswith("local-worker-")] == [
        "local-worker-0",
        "local-worker-1",
    ]  # one log a worker, named for its command (test_locks_and_workers.py)
    for log in (local / ".logs").glob("local-worker-*.log"):
        log.unlink()
    assert run.main(["--suite", str(suite), "--results-dir", str(local)]) == 0
    assert capsys.readouterr().err.count(": cached; Avg ") == 4
    assert not list((local / ".logs").glob("local-worker-*.log"))  # every run finished: no worker started


@pytest.mark.slow
def test_a_killed_local_worker_run_resumes_after_its_last_task(tmp_path, capsys):
    suite = tmp_path / "suite.toml"
    suite.write_text(SUITE.replace("epochs = 1", "epochs = 6"))
    argv = ["--suite", str(suite), "--results-dir", str(tmp_path / "results"), "--quiet"]
    worker = subprocess.Popen(
        runner_command(suite, tmp_path / "results"),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # wait for the first task's checkpoint, then kill the worker outright
    deadline = time.time() + 300
    while time.time() < deadline and not list((tmp_path / "results" / ".checkpoints").rglob("state.json")):
        time.sleep(0.2)
    worker.kill()
    worker.wait()
    state = json.loads(next((tmp_path / "results" / ".checkpoints").rglob("state.json")).read_text())
    assert 1 <= state["tasks_done"] < 3
    assert (
        run.main([*argv, "--launcher", "local", "--workers", "1"]) == 0
    )  # takes over the dead worker's lock
    (log,) = [p.read_text() for p in (tmp_path / "results" / ".logs").glob("local-worker-0.*.log")]
    assert f"resumed after task {state['tasks_done']}" in log and "took over a stale lock" in log


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--workers", "0"], "workers must be a whole number >= 1 or \"auto\", not '0'"),
        (["--workers", "many"], "workers must be a whole number >= 1 or \"auto\", not 'many'"),
        (["--launcher", "local", "--gpus", "0,1,2,3,4,5,6,7,8"], "names GPUs this machine does not have"),
        (["--launcher", "local", "--force"], "--force with --launcher local"),
        (["--launcher", "inline", "--workers", "2"], "belong to --launcher local"),
        (["--workers", "2", "--force"], "--force with --launcher local"),
        (["--launcher", "slurmish"], "invalid choice"),
    ],
)
def test_bad_launcher_input_is_one_line_and_runs_nothing(tmp_path, capsys, extra, message):
    suite = _suite_of_four(tmp_path)
    code = (
        run.main(["--suite", str(suite), "--results-dir", str(tmp_path / "results"), "--quiet", *extra])
        if extra[:2] != ["--launcher", "slurmish"]
        else _exit_code(["--suite", str(suite), *extra])
    )
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "results").exists() or not list(iter_results(tmp_path / "results"))


def _exit_code(argv) -> int:
    try:
        return run.main(argv)
    except SystemExit as exit_:
        return exit_.code


def test_a_run_that_ends_between_two_reads_is_not_said_to_be_another_commands():
    """The local launcher's watch reads a run's state, then its lock's holder: a run finished by this
    command's own worker in between left no holder to read, and was once said to be "computed by
    another command (lock released meanwhile)" (the side-by-side suite, 2026-11-30)."""
    from benchmarks.core.heartbeat_lock import Holder, this_command
    from benchmarks.runner.local_launcher import note_other_command

    now = time.time()
    ours = Holder(socket.gethostname(), os.getpid() + 1, None, now, now, command_pid=this_command()[0])
    theirs = Holder("another-node", 4242, None, now, now, command_pid=4242, command_started=now)
    others: dict = {}
    note_other_command(others, KEY, None)  # released between the two reads
    assert others == {}
    note_other_command(others, KEY, ours)
    assert others == {}
    note_other_command(others, KEY, theirs)
    assert others[KEY].startswith("computed by another command (another-node, pid 4242")
    note_other_command(others, KEY, None)  # the other command finished it: still its run
    assert others[KEY].startswith("computed by another command (another-node")
    note_other_command(others, KEY, ours)  # taken over by this command's worker
    assert others == {}
