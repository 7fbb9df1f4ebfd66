"""Locks and workers that cannot strand a run: a damaged lock (cut-off JSON, a pid that is not a
number) is judged by its age and named; local workers end with their launcher (SIGTERM, kill -9)
and release their locks; a run another command holds is named with its holder and is no error;
worker logs are per command."""

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from benchmarks import run
from benchmarks.core.heartbeat_lock import read_holder
from benchmarks.runner import status
from benchmarks.runner.locking import RunLock
from benchmarks.runner.reading import iter_results
from benchmarks.runner.results import ResultStore, RunKey
from tests.helpers import runner_command, three_task_suite

ROOT = Path(__file__).resolve().parents[2]
KEY = RunKey("finetune", "synthetic", 3, 0)
SUITE = three_task_suite("finetune", "epochs = 1\nbatch_size = 40\neval_batch_size = 100\nlora_rank = 2")
pytestmark = pytest.mark.spread


def _aged(path: Path, text: str, age: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (time.time() - age, time.time() - age))
    return path


@pytest.mark.parametrize(
    "text, why",
    [
        ('{"host": "node7", "pid": 42', "cut-off or invalid JSON"),  # a full disk, a network file system
        ('{"host": "node7", "pid": "forty-two", "since": 0}', "unreadable: invalid literal for int()"),
        ("[]", "unreadable: not a JSON object"),
    ],
)
def test_a_damaged_lock_is_named_and_judged_by_its_age_like_an_empty_one(tmp_path, text, why):
    path = _aged(tmp_path / "run.lock", text, age=10)
    holder = read_holder(path)
    assert holder.damaged.startswith(why) and f"a damaged lock file {path} ({why}" in holder.describe()
    assert not RunLock(path).acquire()  # young: maybe a lock being written, or a holder alive
    _aged(path, text, age=3600)  # an hour without a heartbeat: stale, taken over
    lock = RunLock(path)
    assert lock.acquire() and lock.took_over.damaged
    assert read_holder(path).pid == os.getpid() and not read_holder(path).damaged
    lock.release()
    assert not path.exists()


def test_status_names_a_damaged_lock_young_as_running_and_stale_as_to_run(tmp_path):
    store = ResultStore(tmp_path)
    path = _aged(store.lock(KEY).path, '{"host": "node7", "pi', age=10)
    state = status.run_state(store, KEY)
    assert (
        state.state == "running" and f"a damaged lock file {path} (cut-off or invalid JSON)" in state.detail
    )
    _aged(path, '{"host": "node7", "pi', age=3600)
    state = status.run_state(store, KEY)
    assert state.state == "to run" and "a damaged lock file" in state.detail and "taken over" in state.detail


def test_a_lock_names_its_command_and_a_held_run_names_its_holder_and_is_no_error(tmp_path, capsys):
    """The inline launcher: a run a live command holds is computed by it; this command exits 0."""
    lock = RunLock(ResultStore(tmp_path / "results").lock(KEY).path)
    assert lock.acquire()  # held by this live process, as another command would hold it
    try:
        holder = read_holder(lock.path)
        assert holder.command_pid == os.getpid() and holder.command_started <= time.time()
        suite = tmp_path / "suite.toml"
        suite.write_text(SUITE)
        os.environ["CIL_BENCH_COMMAND"] = "1 0"  # this command is another one than the holder's
        try:
            code = run.main(["--suite", str(suite), "--results-dir", str(tmp_path / "results"), "--quiet"])
        finally:
            del os.environ["CIL_BENCH_COMMAND"]
    finally:
        lock.release()
    assert code == 0
    err = capsys.readouterr().err
    assert f"computed by another command ({socket.gethostname()}, pid {os.getpid()}, since" in err
    assert f"of the command (pid {os.getpid()}) started" in err and "did not finish" not in err


@pytest.mark.slow  # a suite run
def test_a_run_behind_an_hour_old_cut_off_lock_is_taken_over_and_the_lock_named(tmp_path, capsys):
    """Today's bug: blocked forever while the command exits 0 and status says "to run"."""
    results = tmp_path / "results"
    path = _aged(ResultStore(results).lock(KEY).path, '{"host": "node7", "pid": 42, "si', age=3600)
    suite = tmp_path / "suite.toml"
    suite.write_text(SUITE)
    assert run.main(["--suite", str(suite), "--results-dir", str(results), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert f"took over a stale lock of a damaged lock file {path} (cut-off or invalid JSON)" in err
    assert status.run_state(ResultStore(results), KEY).state == "finished" and not path.exists()


def test_sigterm_stops_as_ctrl_c_and_its_echo_is_ignored():
    """A worker whose launcher died hears SIGTERM twice (Linux's PR_SET_PDEATHSIG and the pipe): the
    first stops it as Ctrl-C does (its lock released on the way out), the second must not cut that
    clean-up short."""
    from benchmarks.runner.termination import Terminated, restore_sigterm, stop_on_sigterm

    previous = stop_on_sigterm()
    try:
        with pytest.raises(Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs here
        os.kill(os.getpid(), signal.SIGTERM)  # the echo: ignored
        time.sleep(0.2)
    finally:
        restore_sigterm(previous)
    assert signal.getsignal(signal.SIGTERM) == previous


def test_a_sigterm_whose_terminated_was_swallowed_stops_the_run_before_its_next_task(tmp_path, monkeypatch):
    """A library's bare ``except:`` (or a finaliser) may swallow the ``Terminated`` a SIGTERM raises:
    seen in CI, a local worker then finished both its runs after its launcher had ended. The runner
    asks again before each run and each task, so the run stops with its finished tasks kept."""
    from benchmarks import run
    from benchmarks.runner import learning
    from benchmarks.runner.termination import Terminated, restore_sigterm, stop_on_sigterm

    previous = stop_on_sigterm()
    try:
        try:  # as a library's bare except does
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        except BaseException:
            pass
        tasks = []
        real = learning.seed_everything
        monkeypatch.setattr(learning, "seed_everything", lambda *a: (tasks.append(a), real(*a))[1])
        with pytest.raises(Terminated):
            learning.stop_if_terminated()
        suite = tmp_path / "suite.toml"
        suite.write_text(SUITE)
        code = run.main(["--suite", str(suite), "--results-dir", str(tmp_path / "results"), "--quiet"])
        assert code == 143 and tasks == []  # stopped before its first run, nothing learned
    finally:
        restore_sigterm(previous)


def _one_local_worker(suite: Path, results: Path) -> subprocess.CompletedProcess:
    """The suite run by a command with one local worker, as a user would start it."""
    command = runner_command(suite, results, "--launcher", "local", "--workers", "1")
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)


def _wait(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.2)
    raise AssertionError(f"waited {seconds} s for {what}")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _long_suite(tmp_path) -> Path:
    suite = tmp_path / "suite.toml"
    suite.write_text(SUITE.replace("epochs = 1", "epochs = 30").replace("seeds = [0]", "seeds = [0, 1]"))
    return suite


#: the launcher with no PR_SET_PDEATHSIG for its workers, as where prctl is missing: the pipe alone
WITHOUT_PRCTL = (
    "import sys; from benchmarks.runner import local_launcher; local_launcher._die_with = lambda pid: None; "
    "from benchmarks import run; sys.exit(run.main(sys.argv[1:]))"
)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigterm", "kill -9", "kill -9 without prctl"])
def test_local_workers_end_with_their_launcher_and_release_their_locks(tmp_path, how):
    results = tmp_path / "results"
    command = runner_command(_long_suite(tmp_path), results, "--launcher", "local", "--workers", "2")
    if how == "kill -9 without prctl":
        command[1:3] = ["-c", WITHOUT_PRCTL]  # python -c ... instead of python -m benchmarks.run
    launcher = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        locks = _wait(lambda: list((results / ".locks").rglob("*.lock")), 300, "a worker to take a lock")
        workers = [p.pid for p in psutil.Process(launcher.pid).children()]
        assert len(workers) == 2 and locks
        if how == "sigterm":
            launcher.send_signal(signal.SIGTERM)
            assert launcher.wait(timeout=120) == 143
            assert "interrupted" in launcher.stderr.read()
        else:
            launcher.kill()
            launcher.wait()
        _wait(lambda: all(_gone(pid) for pid in workers), 120, "the workers to end")
    finally:
        for pid in [launcher.pid, *workers]:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
    assert not list((results / ".locks").rglob("*.lock"))  # each worker released its lock
    assert not list(iter_results(results))  # stopped mid-run: nothing finished, tasks kept to resume


@pytest.mark.slow
def test_two_identical_local_commands_started_together_both_exit_0_with_logs_of_their_own(tmp_path):
    suite = tmp_path / "four.toml"
    suite.write_text(
        SUITE.replace('strategies = ["finetune"]', 'strategies = ["continual_clip", "finetune"]').replace(
            "seeds = [0]", "seeds = [0, 1]"
        )
    )
    results = tmp_path / "results"
    command = runner_command(suite, results, "--launcher", "local", "--workers", "2")
    commands = [
        subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [c.communicate(timeout=900) for c in commands]
    assert [c.returncode for c in commands] == [0, 0], outputs
    for _, err in outputs:
        assert "error" not in err and "did not finish" not in err, err
    logs = sorted((results / ".logs").glob("local-worker-*.log"))
    ran = [line for log in logs for line in log.read_text().splitlines() if ": ran;" in line]
    assert len(ran) == 4 and len({line.split(":")[0] for line in ran}) == 4  # each run computed once
    for _, err in outputs:  # each command names every run: computed here, or by the other command
        ended = [line for line in err.splitlines() if ": ran;" in line or ": computed by another" in line]
        assert len({line.split(":")[0] for line in ended}) == 4, err
    assert len(list(iter_results(results))) == 4 and not list((results / ".locks").rglob("*.lock"))
    # one log per worker per command: neither command wrote into or truncated the other's
    assert len(logs) == 4 and len({log.name.split(".", 1)[1] for log in logs}) == 2
    assert all(log.read_text() for log in logs)
    first = logs[0].read_text()
    assert (
        subprocess.run(command, cwd=ROOT, capture_output=True, text=True).returncode == 0
    )  # a rerun: every run cached, no worker started, no log touched
    assert sorted((results / ".logs").glob("local-worker-*.log")) == logs and logs[0].read_text() == first


@pytest.mark.slow
def test_a_rerun_of_the_local_launcher_names_the_live_holder_of_a_run_and_exits_0(tmp_path):
    """An orphan (or another command) holds a run: the rerun names it, instead of "did not finish"."""
    results = tmp_path / "results"
    path = ResultStore(results).lock(KEY).path
    path.parent.mkdir(parents=True, exist_ok=True)
    holder = {"host": socket.gethostname(), "pid": os.getpid(), "job_id": None, "since": time.time()}
    path.write_text(json.dumps({**holder, "token": "x", "command_pid": 4242, "command_started": 0.0}))
    suite = tmp_path / "suite.toml"
    suite.write_text(SUITE)
    done = _one_local_worker(suite, results)
    assert done.returncode == 0, done.stderr
    assert f"computed by another command ({socket.gethostname()}, pid {os.getpid()}, since" in done.stderr
    assert "of the command (pid 4242) started" in done.stderr
    assert "did not finish" not in done.stderr


def test_a_command_that_finished_nothing_says_what_failed_and_what_is_held():
    from benchmarks.runner.launcher import Outcome, nothing_finished

    other = RunKey("finetune", "synthetic", 3, 1)
    failed = Outcome(2, failed=[f"{KEY}: training loss became nan (log: x.log)"], held=[other])
    assert nothing_finished(failed) == (
        f"no run finished here: 1 failed; 1 held by another command; the first: {KEY}: training loss "
        "became nan (log: x.log)"
    )
    assert "2 failed" in nothing_finished(Outcome(2, failed=["a", "b"])) and "(1 more above)" in (
        nothing_finished(Outcome(2, failed=["a", "b"]))
    )
    assert "every run is held by another command" in nothing_finished(Outcome(0, held=[other]))


@pytest.mark.slow
def test_a_local_command_whose_run_failed_names_the_failure_not_another_command(tmp_path):
    suite = tmp_path / "suite.toml"
    suite.write_text(SUITE.replace("epochs = 1", "epochs = 3\nlr = 1e9"))  # the loss diverges
    done = subprocess.run(
        runner_command(suite, tmp_path / "results", "--launcher", "local", "--workers", "1"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2, done.stderr
    assert "held by another command" not in done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("no run finished here")]
    assert line.startswith(f"no run finished here: 1 failed; the first: {KEY}: ") and "nan" in line
    assert f"(log: {tmp_path / 'results' / '.logs'}" in line


@pytest.mark.slow
def test_a_local_worker_that_resumed_a_run_says_so_on_the_console(tmp_path, monkeypatch):
    from strategies.methods.finetune import Finetune

    real_loss = Finetune.compute_loss

    def nan_in_task_2(self, logits, targets):
        loss = real_loss(self, logits, targets)
        return loss * float("nan") if len(self.task_classes) == 1 else loss  # one task learned before

    suite, results = tmp_path / "suite.toml", tmp_path / "results"
    suite.write_text(SUITE)
    monkeypatch.setattr(Finetune, "compute_loss", nan_in_task_2)
    assert run.main(["--suite", str(suite), "--results-dir", str(results), "--quiet"]) == 2  # task 1 kept
    done = _one_local_worker(suite, results)
    assert done.returncode == 0, done.stderr
    assert f"{KEY}: resumed after task 1; Avg " in done.stderr
