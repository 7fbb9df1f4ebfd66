"""The SLURM launcher through submitit, with SLURM's tools replaced by ``tests/runner/fake_slurm.py``:
the job script submitit generates, a job preempted after its first task that is requeued and
resumes, --no-wait and collecting, nothing submitted twice, one-line errors, jobs that died before
Python could record it and jobs that can never start. ``test_slurm_real.py`` runs on a real SLURM."""

import json
import os
import signal
import time
from pathlib import Path

import pytest

from benchmarks import run
from benchmarks.core.errors import UserError
from benchmarks.core.heartbeat_lock import read_holder
from benchmarks.runner import slurm_launcher as slurm
from benchmarks.runner.locking import RunLock
from benchmarks.runner.reading import iter_results
from benchmarks.runner.results import ResultStore, RunKey
from benchmarks.runner.slurm_launcher import SlurmOptions
from benchmarks.runner.status import run_state
from tests.helpers import three_task_suite
from tests.runner import fake_slurm

SUITE = three_task_suite(
    "finetune", "epochs = 6\nbatch_size = 40\neval_batch_size = 100\nlora_rank = 2"
).replace("seeds = [0]", "seeds = [0, 1]")
SEED0, SEED1 = RunKey("finetune", "synthetic", 3, 0), RunKey("finetune", "synthetic", 3, 1)


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """Fake SLURM tools first on PATH; returns their state folder."""
    folder = tmp_path / "fake-slurm"
    for name, value in fake_slurm.environment(folder).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(slurm, "POLL_SECONDS", 0.5)
    from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob

    monkeypatch.setattr(SlurmJob, "watcher", SlurmInfoWatcher(delay_s=600))  # no job states from other tests
    return folder


def _suite(tmp_path, launcher_table: str = "") -> Path:
    path = tmp_path / "suite.toml"
    path.write_text(SUITE + ("\n[launcher]\n" + launcher_table if launcher_table else ""))
    return path


def _argv(tmp_path, *extra, launcher_table: str = ""):
    """The runner's arguments for the suite (with ``launcher_table``) under --launcher slurm."""
    return [
        "--suite",
        str(_suite(tmp_path, launcher_table)),
        "--results-dir",
        str(tmp_path / "results"),
        "--quiet",
        "--device",
        "cpu",
        "--launcher",
        "slurm",
        *extra,
    ]


def _wait_for(condition, seconds=300.0):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if value := condition():
            return value
        time.sleep(0.1)
    raise AssertionError("timed out")


def test_options_come_from_the_suite_table_with_the_command_line_on_top():
    table = {"partition": "gpu", "time": 600, "gpus": 2, "setup": ["module load cuda"], "qos": "normal"}
    options = SlurmOptions.resolve(table, {"time": 90, "account": "lab", "partition": None})
    assert (options.partition, options.time, options.gpus, options.account) == ("gpu", 90, 2, "lab")
    parameters = options.executor_parameters("cil-main")
    assert parameters["timeout_min"] == 90 and parameters["gpus_per_node"] == 2
    assert parameters["slurm_partition"] == "gpu" and parameters["slurm_qos"] == "normal"
    assert parameters["slurm_setup"] == ["module load cuda"] and "slurm_constraint" not in parameters
    assert "gpus_per_node" not in SlurmOptions(gpus=0).executor_parameters(
        "x"
    )  # a CPU-only job asks for none
    for bad in (
        {"partiton": "gpu"},
        {"time": "long"},
        {"gpus": -1},
        {"setup": "module load cuda"},
        {"mem_gb": 0},
        {"time": True},
    ):
        with pytest.raises(UserError):
            SlurmOptions.resolve(bad, {})


@pytest.mark.slow
def test_a_job_array_is_submitted_and_a_preempted_job_is_requeued_and_resumes(tmp_path, cluster, capsys):
    argv = _argv(
        tmp_path,
        "--slurm-partition",
        "gpu",
        "--slurm-time",
        "30",
        "--slurm-gpus",
        "1",
        "--slurm-array-parallelism",
        "2",
        "--slurm-setup",
        "export CIL_SETUP_RAN=1",
        "--no-wait",
    )
    assert run.main(argv) == 0  # submits and returns
    script = (cluster / "sbatch-1000.sh").read_text()
    for line in (
        "#SBATCH --partition=gpu",
        "#SBATCH --time=30",
        "#SBATCH --gpus-per-node=1",
        "#SBATCH --array=0-1%2",
        "#SBATCH --signal=USR2@120",
        "export CIL_SETUP_RAN=1",
    ):
        assert line in script.splitlines(), line
    store = ResultStore(tmp_path / "results")
    assert store.lock(SEED0).read_queued()["job_id"] == "1000_0"

    # SLURM's warning before preemption, once the first task's checkpoint is written
    checkpoint = store.checkpoint_state_path(SEED0)
    _wait_for(lambda: checkpoint.exists() and json.loads(checkpoint.read_text())["tasks_done"] >= 1)
    holder = _wait_for(lambda: read_holder(store.lock(SEED0).path))
    assert holder.job_id == "1000_0"
    os.kill(holder.pid, signal.SIGUSR2)
    _wait_for(lambda: (cluster / "requeued").exists())

    # the same command again: submits nothing, waits for both jobs, prints the table
    capsys.readouterr()
    assert run.main(argv[:-1]) == 0
    out, err = capsys.readouterr()
    assert (cluster / "next_id").read_text() == "1001"  # no second sbatch
    assert "already queued or running" in err
    assert "| finetune |" in out
    assert (cluster / "requeued").read_text().split() == ["1000_0"]
    log = (tmp_path / "results" / ".logs" / SEED0.relpath.with_suffix(".log")).read_text()
    assert "Requeued job 1000_0" in log
    assert "resumed after task" in log  # the requeued job went on from its checkpoint
    assert all(run_state(store, key).state == "finished" for key in (SEED0, SEED1))
    assert not store.lock(SEED0).queued_path.exists()

    # the requeued run ends exactly as a run that was never interrupted
    inline = tmp_path / "inline"
    assert (
        run.main(
            [
                "--suite",
                str(_suite(tmp_path)),
                "--results-dir",
                str(inline),
                "--quiet",
                "--device",
                "cpu",
                "--seeds",
                "0",
            ]
        )
        == 0
    )
    (expected,) = [r for _, r in iter_results(inline)]
    assert store.finished(SEED0, None).to_json()["stages"] == expected["stages"]

    # collecting again with --no-wait submits nothing and prints the table
    assert run.main(argv) == 0
    assert (cluster / "next_id").read_text() == "1001" and "| finetune |" in capsys.readouterr().out


def test_a_rerun_submits_only_runs_whose_job_has_ended(tmp_path, cluster, capsys):
    (cluster / "hold").mkdir(parents=True)  # submitted jobs stay pending
    store = ResultStore(tmp_path / "results")
    store.lock(SEED0).mark_queued("900_0")  # an earlier job: still pending
    store.lock(SEED1).mark_queued("900_1")  # an earlier job that failed before starting the run
    (cluster / "sacct.txt").write_text("900_0|PENDING|None\n900_1|FAILED|node7\n")
    assert run.main(_argv(tmp_path, "--no-wait")) == 0
    script = (cluster / "sbatch-1000.sh").read_text()
    assert "#SBATCH --array" not in script  # one run: a single job
    assert store.lock(SEED0).read_queued()["job_id"] == "900_0"
    assert store.lock(SEED1).read_queued()["job_id"] == "1000"
    assert "already queued or running in earlier jobs (900_0)" in capsys.readouterr().err
    assert run_state(store, SEED1).state == "queued"


@pytest.mark.parametrize(
    "extra, table, message",
    [
        ([], "", "needs SLURM's sbatch and srun on PATH"),
        (["--slurm-partition", "gpu", "--launcher", "inline"], "", "belong to --launcher slurm"),
        (["--no-wait", "--launcher", "local"], "", "belong to --launcher slurm"),
        (["--workers", "2"], "", "belong to --launcher local"),
        (["--force"], "", "--force with --launcher slurm"),
        (["--slurm-time", "soon"], "", "invalid int value"),
        ([], 'partiton = "gpu"', "unknown key(s) ['partiton']"),
        ([], 'time = "long"', "time must be a whole number"),
        (["--slurm-time", "2"], "", "--slurm-time 2 (minutes) leaves a job 0 s before SLURM's warning"),
        (["--slurm-time", "2"], "", "Give --slurm-time 3 or more"),
        (
            [],
            "time = 1\nsignal_delay = 30",
            "leaves a job 30 s before SLURM's warning signal (signal_delay = 30",
        ),
    ],
)
def test_bad_slurm_input_is_one_line_and_submits_nothing(
    tmp_path, monkeypatch, capsys, extra, table, message
):
    empty = tmp_path / "no-slurm"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no sbatch anywhere
    try:
        code = run.main(_argv(tmp_path, *extra, launcher_table=table))
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "results" / ".logs").exists()


def test_a_time_limit_that_leaves_little_work_before_the_signal_is_warned_about():
    with pytest.warns(UserWarning, match="leaves a job 3 min before SLURM's warning signal"):
        options = SlurmOptions.resolve({"time": 5}, {})
    assert options.executor_parameters("x")["slurm_signal_delay_s"] == 120


def test_a_job_that_died_before_python_could_record_it_is_failed_with_its_log_line(tmp_path, cluster, capsys):
    """kill -9 or the OOM killer: no error record, the queued mark stays; SLURM says how it ended."""
    store = ResultStore(tmp_path / "results")
    store.lock(SEED0).mark_queued("900_0")
    store.lock(SEED1).mark_queued("900_1")
    logs = tmp_path / "results" / ".logs" / "slurm"
    logs.mkdir(parents=True)
    (logs / "900_0_0_log.err").write_text(
        "task 1/3\nsrun: error: node7: task 0: Killed\nsrun: Force Terminated StepId=900.0\n\n"
    )
    (cluster / "sacct.txt").write_text("900_0|FAILED|node7\n900_1|OUT_OF_MEMORY|node7\n")
    state = run_state(store, SEED0)
    assert state.state == "failed"
    assert state.detail == "SLURM job 900_0 FAILED: srun: error: node7: task 0: Killed"
    assert run_state(store, SEED1).detail == "SLURM job 900_1 OUT_OF_MEMORY: no job log"
    # an error recorded by an earlier attempt says nothing about the job submitted after it
    error = store.lock(SEED0).error_path
    error.write_text(json.dumps({"error": "RuntimeError: old", "host": "node7", "when": 0.0}))
    assert run_state(store, SEED0).detail.startswith("SLURM job 900_0 FAILED: srun: error")
    error.unlink()
    # a job SLURM still holds is queued, with SLURM's word on it
    (cluster / "squeue.txt").write_text("900_1|PENDING|Priority\n")
    assert run_state(store, SEED1).detail.startswith("SLURM job 900_1 PENDING (Priority), submitted ")
    from benchmarks.runner import status

    assert status.main(["--results-dir", str(tmp_path / "results")]) == 0
    table = capsys.readouterr().out
    assert "| failed | SLURM job 900_0 FAILED: srun: error: node7: task 0: Killed |" in table
    assert "1 queued, 1 failed" in table


def test_status_says_when_slurm_could_not_be_asked(tmp_path, monkeypatch):
    empty = tmp_path / "no-slurm"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    store = ResultStore(tmp_path / "results")
    store.lock(SEED0).mark_queued("900_0")
    state = run_state(store, SEED0)
    assert state.state == "queued" and "(SLURM not asked: sacct is not on PATH)" in state.detail


def test_a_job_that_can_never_start_is_cancelled_and_reported_with_slurms_reason(tmp_path, cluster, capsys):
    (cluster / "hold").mkdir(parents=True)  # submitted jobs stay pending
    (cluster / "squeue.txt").write_text("1000_0|PENDING|PartitionConfig\n1000_1|PENDING|Resources\n")
    argv = _argv(tmp_path, "--slurm-cpus", "4")
    # the waiting launcher gives up on 1000_0; 1000_1 may start later, so it ends only by sacct
    (cluster / "sacct.txt").write_text("1000_1|CANCELLED by 0|None\n")
    assert run.main(argv) == 2
    err = capsys.readouterr().err
    line = (
        "SLURM job 1000_0 could never start: it pends with reason PartitionConfig, because the "
        "partition's nodes cannot give what each job asks for (--slurm-cpus, --slurm-gpus, --slurm-mem-gb); "
        "cancelled"
    )
    assert f"{SEED0}: {line}" in err
    assert (cluster / "cancelled").read_text().split() == ["1000_0"]
    store = ResultStore(tmp_path / "results")
    state = run_state(store, SEED0)
    assert state.state == "failed" and state.detail.startswith(line)
    assert not store.lock(SEED0).queued_path.exists()


def test_a_rerun_cancels_a_job_that_can_never_start_and_submits_its_run_again(tmp_path, cluster, capsys):
    (cluster / "hold").mkdir(parents=True)
    store = ResultStore(tmp_path / "results")
    store.lock(SEED0).mark_queued("900_0")
    store.lock(SEED1).mark_queued("900_1")
    (cluster / "squeue.txt").write_text("900_0|PENDING|QOSMaxCpuPerJobLimit\n900_1|PENDING|Priority\n")
    state = run_state(store, SEED0)
    assert state.state == "queued" and state.detail.startswith(
        "SLURM job 900_0 PENDING (QOSMaxCpuPerJobLimit)"
    )
    assert state.detail.endswith(
        "; it can never start: a limit of your QOS or association on one job is lower than what each "
        "job asks for; scancel 900_0, or rerun the command with other options"
    )
    assert run.main(_argv(tmp_path, "--no-wait")) == 0
    assert (cluster / "cancelled").read_text().split() == ["900_0"]
    assert store.lock(SEED0).read_queued()["job_id"] == "1000"  # submitted again
    assert store.lock(SEED1).read_queued()["job_id"] == "900_1"  # left in its job
    assert "could never start: it pends with reason QOSMaxCpuPerJobLimit" in capsys.readouterr().err


def test_a_requeued_job_takes_over_the_lock_of_its_previous_life(tmp_path, monkeypatch):
    path = tmp_path / "run.lock"
    path.write_text(
        json.dumps({"host": "node7", "pid": 4242, "job_id": "77_3", "since": time.time(), "token": "x"})
    )
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "78")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    assert not RunLock(path).acquire()  # another job's live lock
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "77")
    lock = RunLock(path)
    assert lock.acquire() and lock.took_over.job_id == "77_3"  # the same job, killed before its requeue
    lock.release()


def test_the_queued_mark_lasts_until_the_run_finishes_or_its_job_fails(tmp_path, monkeypatch, cluster):
    store = ResultStore(tmp_path)
    key = RunKey("finetune", "synthetic", 3, 0)
    monkeypatch.setenv("SLURM_JOB_ID", "55")
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    store.lock(key).mark_queued("55")
    state = run_state(store, key)
    assert state.state == "queued" and "SLURM job 55" in state.detail
    lock = store.lock(key)
    assert lock.acquire()
    assert run_state(store, key).state == "running"
    lock.release()  # interrupted (preempted): the job is requeued, the mark stays
    assert run_state(store, key).state == "queued"
    assert lock.acquire()
    lock.release(error="RuntimeError: boom")  # this job failed: not queued any more
    assert run_state(store, key).state == "failed" and not lock.queued_path.exists()
    store.lock(key).mark_queued("56")  # resubmitted
    assert run_state(store, key).state == "queued"
    monkeypatch.setenv("SLURM_JOB_ID", "57")
    lock = store.lock(key)
    assert lock.acquire()
    lock.release(error="RuntimeError: boom")  # another job's failure leaves job 56's mark
    assert lock.read_queued()["job_id"] == "56"
