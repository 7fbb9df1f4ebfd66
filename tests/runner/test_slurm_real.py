"""The SLURM launcher on a real SLURM (CI starts a one-node one with ``.ci/slurm/start``): a tiny
suite run as a job array equals the inline run; a job requeued with ``scontrol requeue``, and one
preempted by a job on the higher partition, each resume after their last finished task and end
equal to inline; a job killed with ``kill -9`` is reported failed with SLURM's word, and a rerun
resumes it. A job array of ``benchmarks.tune`` workers shares one study and its budget.
``test_slurm.py`` covers the same launcher with SLURM's tools faked.

Skipped where there is no ``sbatch``, or no controller answers; ``CIL_REQUIRE_SLURM=1`` (set by
``.ci/run``) turns a missing SLURM into a failure instead. The preemption test needs the partitions
``cil-low`` (preemptable, requeued) and ``cil-high`` that ``.ci/slurm/slurm.conf.in`` defines.
"""

import json
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time

import pytest

from benchmarks import run
from benchmarks.core.heartbeat_lock import read_holder
from benchmarks.runner import slurm_launcher as slurm
from benchmarks.runner import status
from benchmarks.runner.reading import iter_results
from benchmarks.runner.results import ResultStore, RunKey
from benchmarks.runner.status import run_state
from tests.runner.test_slurm import SEED0, SEED1, SUITE
from tests.runner.test_tune_workers import check_shared_study, shared_tune, study_trials

LOW, HIGH = "cil-low", "cil-high"  # .ci/slurm/slurm.conf.in: HIGH's jobs preempt LOW's, which are requeued
# The interrupted runs' suite: their first life waits before task 2 (tests/runner/first_life_pause.py)
PAUSED_SUITE = SUITE.replace(
    "lora_rank = 2", 'lora_rank = 2\nplugins = { "tests.runner.first_life_pause:PauseFirstLife" = {} }'
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("sbatch") is None and not os.environ.get("CIL_REQUIRE_SLURM"),
        reason="no sbatch on PATH: no SLURM here (.ci/slurm/install and .ci/slurm/start set one up)",
    ),
]


def _slurm(*args: str) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=True, timeout=60).stdout


@pytest.fixture(scope="module")
def partitions() -> list[str]:
    """The partitions of the running SLURM (skips the module when none answers)."""
    try:
        names = _slurm("sinfo", "--noheader", "--format=%R").split()
    except (OSError, subprocess.SubprocessError) as err:
        if os.environ.get("CIL_REQUIRE_SLURM"):
            raise
        said = (getattr(err, "stderr", None) or str(err)).strip().splitlines()[-1]
        pytest.skip(f"SLURM does not answer (sinfo: {said}); start it with .ci/slurm/start")
    return names


@pytest.fixture(scope="module")
def inline_stages(tmp_path_factory) -> dict[int, list]:
    """The stages of each seed's run under the inline launcher: what every SLURM run must equal."""
    root = tmp_path_factory.mktemp("inline")
    (root / "suite.toml").write_text(SUITE)
    argv = ["--suite", str(root / "suite.toml"), "--results-dir", str(root / "results"), "--quiet"]
    assert run.main([*argv, "--device", "cpu"]) == 0
    return {result["seed"]: result["stages"] for _, result in iter_results(root / "results")}


@pytest.fixture
def quick_poll(monkeypatch):
    monkeypatch.setattr(slurm, "POLL_SECONDS", 1.0)
    from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob

    monkeypatch.setattr(SlurmJob, "watcher", SlurmInfoWatcher(delay_s=600))  # no job states from other tests


def _argv(tmp_path, *extra: str, partition: str = LOW, suite: str = SUITE) -> list[str]:
    (tmp_path / "suite.toml").write_text(suite)
    return [
        "--suite",
        str(tmp_path / "suite.toml"),
        "--results-dir",
        str(tmp_path / "results"),
        "--quiet",
        "--device",
        "cpu",
        "--launcher",
        "slurm",
        "--slurm-partition",
        partition,
        "--slurm-gpus",
        "0",
        "--slurm-cpus",
        "1",
        "--slurm-time",
        "30",  # long enough that submitit counts a signal as a preemption, not a time limit
        *extra,
    ]


def _wait_for(condition, seconds: float = 300.0, what: str = "a condition"):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if value := condition():
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _tasks_done(store: ResultStore, key: RunKey) -> int:
    try:
        return json.loads(store.checkpoint_state_path(key).read_text())["tasks_done"]
    except (FileNotFoundError, ValueError, KeyError):
        return 0


def _job_of(store: ResultStore, key: RunKey) -> str:
    return store.lock(key).read_queued()["job_id"]


def _start_when_requeued(job_id: str) -> None:
    """SLURM holds a requeued job back for two minutes (reason BeginTime); start it at once."""

    def pending():
        return _slurm("squeue", "--noheader", "--format=%T", "--jobs", job_id).strip() == "PENDING"

    _wait_for(pending, 120, f"job {job_id} to be requeued")
    _slurm("scontrol", "update", f"JobId={job_id}", "StartTime=now")


def _interrupted_after_the_first_task(tmp_path, interrupt) -> tuple[ResultStore, str]:
    """Submit seed 0 alone, call ``interrupt(store, job_id)`` once its first task is checkpointed;
    return the store and the job id."""
    assert run.main(_argv(tmp_path, "--seeds", "0", "--no-wait", suite=PAUSED_SUITE)) == 0
    store = ResultStore(tmp_path / "results")
    job_id = _job_of(store, SEED0)
    _wait_for(lambda: _tasks_done(store, SEED0) >= 1, what="the first task's checkpoint")
    interrupt(store, job_id)
    return store, job_id


def _states(job_id: str) -> list[str]:
    """Every state the job went through, one per life (sacct --duplicates)."""
    return _slurm(
        "sacct", "--duplicates", "-X", "--noheader", "--parsable2", "-o", "State", "-j", job_id
    ).split()


ACTIVE_STATES = {"PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "RESIZING", "SUSPENDED"}


def _final_states(job_id: str, seconds: float = 60.0) -> list[str]:
    """The job's states once the accounting has caught up: squeue forgets a job before slurmdbd
    records its end, so a job gone from the queue can still read RUNNING in sacct for a moment."""

    def settled():
        states = _states(job_id)
        return states if states and not ACTIVE_STATES.intersection(states) else None

    try:
        return _wait_for(settled, seconds, f"the accounting of job {job_id}")
    except AssertionError:
        return _states(job_id)  # still unsettled: let the caller's assertion show them


def _resumed(tmp_path, store: ResultStore, suite: str = SUITE) -> str:
    """Wait for seed 0 through the launcher; return its run log, which tells it resumed."""
    assert run.main(_argv(tmp_path, "--seeds", "0", suite=suite)) == 0
    log = (store.root / ".logs" / SEED0.relpath.with_suffix(".log")).read_text()
    assert "resumed after task" in log
    return log


def test_a_job_array_on_slurm_equals_the_inline_run(tmp_path, partitions, inline_stages, quick_poll, capsys):
    argv = _argv(tmp_path)
    assert run.main([*argv, "--no-wait"]) == 0
    store = ResultStore(tmp_path / "results")
    assert status.main(["--results-dir", str(store.root)]) == 0
    assert "SLURM job " in capsys.readouterr().out  # queued or running, as SLURM says
    assert run.main(argv) == 0  # collects: waits for both jobs, submits nothing
    out, err = capsys.readouterr()
    assert "| finetune |" in out and "already queued or running" in err
    for key in (SEED0, SEED1):
        assert run_state(store, key).state == "finished"
        assert store.finished(key, None).to_json()["stages"] == inline_stages[key.seed]
        assert not store.lock(key).queued_path.exists()


def test_a_job_requeued_with_scontrol_resumes_and_equals_inline(
    tmp_path, partitions, inline_stages, quick_poll
):
    def requeue(store, job_id):
        _slurm("scontrol", "requeue", job_id)
        _start_when_requeued(job_id)

    store, job_id = _interrupted_after_the_first_task(tmp_path, requeue)
    _resumed(tmp_path, store, PAUSED_SUITE)
    assert store.finished(SEED0, None).to_json()["stages"] == inline_stages[0]
    assert _states(job_id)[:1] == ["REQUEUED"]  # its first life; the last may still be completing


def test_a_job_preempted_by_the_higher_partition_resumes_and_equals_inline(
    tmp_path, partitions, inline_stages, quick_poll
):
    if not {LOW, HIGH} <= set(partitions):
        pytest.skip(f"needs the partitions {LOW} and {HIGH} of .ci/slurm/slurm.conf.in, not {partitions}")
    node_cpus = _slurm("sinfo", "--noheader", f"--partition={HIGH}", "--format=%c").split()[0]

    def preempt(store, job_id):
        # a job on the higher partition that needs every CPU of the node: the low job must go
        _slurm("sbatch", f"--partition={HIGH}", f"--cpus-per-task={node_cpus}", "--output=/dev/null",
               "--wrap=sleep 1")  # fmt: skip
        _start_when_requeued(job_id)

    store, job_id = _interrupted_after_the_first_task(tmp_path, preempt)
    _resumed(tmp_path, store, PAUSED_SUITE)
    assert store.finished(SEED0, None).to_json()["stages"] == inline_stages[0]
    assert _states(job_id)[:1] == ["PREEMPTED"]


def test_a_job_killed_with_kill_9_is_failed_and_a_rerun_resumes_it(
    tmp_path, partitions, inline_stages, quick_poll, capsys
):
    store = ResultStore(tmp_path / "results")
    killed, launcher_returned = {}, threading.Event()

    def kill_9_after_the_first_task():
        def ready():
            return launcher_returned.is_set() or (_tasks_done(store, SEED0) >= 1 and read_holder(lock.path))

        lock = store.lock(SEED0)
        if (holder := _wait_for(ready, what="the first task's checkpoint")) is True:
            return  # the job ended before its first task: the test says why
        killed["job_id"] = holder.job_id
        os.kill(holder.pid, signal.SIGKILL)  # the job's Python: no handler, no record of its end

    killer = threading.Thread(target=kill_9_after_the_first_task, daemon=True)
    killer.start()
    code = run.main(_argv(tmp_path, "--seeds", "0"))  # the launcher waits while its job is killed
    launcher_returned.set()
    killer.join()
    logs = sorted((store.root / ".logs").rglob("*.log*"))
    assert "job_id" in killed, "the job ended by itself:\n" + "\n".join(p.read_text()[-2000:] for p in logs)
    assert code == 2
    err = capsys.readouterr().err
    expected = f"SLURM job {killed['job_id']} FAILED: srun: error: "
    assert f"{SEED0}: failed ({expected}" in err and "task 0: Killed; 1/3 tasks kept)" in err, err
    state = run_state(store, SEED0)
    assert state.state == "failed" and state.detail.startswith(expected)
    assert status.main(["--results-dir", str(store.root)]) == 0
    assert f"| failed | {expected}" in capsys.readouterr().out

    # a rerun submits it again, and the new job resumes from the killed one's checkpoint
    _resumed(tmp_path, store)
    assert store.finished(SEED0, None).to_json()["stages"] == inline_stages[0]
    assert not store.lock(SEED0).queued_path.exists() and not store.lock(SEED0).error_path.exists()


def test_a_job_array_of_tune_workers_shares_one_study_and_its_budget(tmp_path, partitions):
    argv, results = shared_tune(tmp_path)
    output = tmp_path / "worker-%a.out"
    job = _slurm(
        "sbatch", "--parsable", "--array=0-1", f"--partition={LOW}", "--cpus-per-task=1",
        f"--output={output}", f"--chdir={os.getcwd()}", "--wrap", shlex.join(argv),
    ).strip()  # fmt: skip

    def ended() -> bool:
        said = subprocess.run(["squeue", "--noheader", "--jobs", job], capture_output=True, text=True)
        return said.returncode != 0 or not said.stdout.strip()  # gone from the queue (or purged)

    _wait_for(ended, 600, f"the tune array {job}")
    outputs = "\n".join(p.read_text()[-2000:] for p in sorted(tmp_path.glob("worker-*.out")))
    assert _final_states(job) == ["COMPLETED", "COMPLETED"], outputs
    check_shared_study(results, workers=2)
    assert all("(SLURM job " in t.user_attrs["worker"] for t in study_trials(results)), outputs
