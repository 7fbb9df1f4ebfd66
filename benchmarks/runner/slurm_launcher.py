"""The SLURM launcher: one job per unfinished run, submitted as one job array through submitit.

``python -m benchmarks.run --suite main --launcher slurm --slurm-partition gpu --slurm-time 720``

* Each job receives its run as plain data (the resolved ``RunSpec``, the ``RunOptions`` and the
  results folder, pickled by submitit) and executes it with the inline launcher, so it takes the
  run's lock, resumes from the run's checkpoint and writes its log under ``<results-dir>/.logs/``
  like any runner. No command line is rebuilt for a job. submitit's own job files (the pickled call, its
  stdout and stderr) go to ``<results-dir>/.logs/slurm/``.
* Preemption and time limits: SLURM sends USR2 ``signal_delay`` seconds before it stops a job;
  submitit then checkpoints the call (``SlurmRun.checkpoint``: the same call again) and requeues
  the job. The requeued job resumes from the run's last finished task; nothing finished is lost.
  A job is requeued at most ``max_requeues`` times for reaching its time limit. A time limit that
  leaves a job less than ``STARTUP_SECONDS`` before that signal is refused before anything is
  submitted: the signal would kill it before submitit's handler exists.
* A job that dies before Python can record why (``kill -9``, the OOM killer) is reported failed,
  with SLURM's state and its log's last line (``benchmarks.runner.slurm_jobs``); a job pending for
  a reason SLURM says it can never meet (``PartitionConfig``: more CPUs than a node has) is
  cancelled and its run reported failed with that reason, instead of waited for forever.
* A submitted run is marked queued (``.locks/.../T<n>-seed<s>.queued``: its job id). Rerunning the
  same command submits only runs that are neither finished, running, nor queued in a job that is
  still alive, so nothing is submitted twice; it then waits (or, with ``--no-wait``, returns) and
  collects what finished.
* Options come from the ``[launcher]`` table of the suite file, overridden by ``--slurm-*`` on the
  command line (``SlurmOptions``).
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import time
import warnings
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import submitit
from tqdm.auto import tqdm

from benchmarks.core.errors import UserError
from benchmarks.core.imports import heavy_imports
from benchmarks.runner.launcher import InlineLauncher, Outcome, RunOptions, prepare_runner_process
from benchmarks.runner.results import ResultStore, RunKey
from benchmarks.runner.run_spec import RunSpec
from benchmarks.runner.slurm_jobs import SlurmView, cancel
from benchmarks.runner.status import run_state, slurm_view

if TYPE_CHECKING:  # light until a job computes: building imports torch, open_clip, Avalanche
    from benchmarks.runner.building import ResolvedRun

POLL_SECONDS = 10.0
# What a job needs before SLURM's warning signal may come: Python, torch and the suite imported,
# and submitit's signal handler installed (before it, USR2 kills the job).
STARTUP_SECONDS = 60
# Below this much time a life between start and the warning signal, a task may never finish.
SHORT_LIFE_SECONDS = 10 * 60


@dataclass(frozen=True)
class SlurmOptions:
    """What every job of the array asks SLURM for. Keys of a suite's ``[launcher]`` table."""

    partition: str | None = None
    time: int = 24 * 60  # minutes
    gpus: int = 1  # per job
    cpus: int = 8  # per job
    mem_gb: float | None = None  # per job; None: the partition's default
    array_parallelism: int = 64  # jobs of the array running at once
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    setup: tuple[str, ...] = ()  # shell lines run before the job, e.g. "module load cuda"
    max_requeues: int = 3  # requeues after reaching the time limit (preemptions do not count)
    signal_delay: int = 120  # seconds between SLURM's warning signal and the stop

    @classmethod
    def resolve(cls, table: dict[str, Any], overrides: dict[str, Any]) -> "SlurmOptions":
        """The suite's ``[launcher]`` table with the command line's values on top, type-checked."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(table) - set(known))
        if unknown:
            raise UserError(f"suite [launcher] has unknown key(s) {unknown}; valid keys: {sorted(known)}")
        values = {**table, **{k: v for k, v in overrides.items() if v is not None}}
        for name, value in values.items():
            default = known[name].default
            if name == "setup":
                if isinstance(value, str) or not all(isinstance(line, str) for line in value):
                    raise UserError(
                        '[launcher] setup must be a list of shell lines, e.g. setup = ["module load cuda"]'
                    )
                values[name] = tuple(value)
            elif name == "mem_gb":
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                    raise UserError(f"[launcher] mem_gb must be a positive number of GB, not {value!r}")
            elif isinstance(default, int):
                if (
                    isinstance(value, bool)
                    or not isinstance(value, int)
                    or value < (0 if name in ("gpus", "max_requeues") else 1)
                ):
                    raise UserError(
                        f"[launcher] {name} must be a whole number"
                        f"{' (0 or more)' if name in ('gpus', 'max_requeues') else ' (1 or more)'}, "
                        f"not {value!r}"
                    )
            elif not isinstance(value, str):
                raise UserError(f"[launcher] {name} must be a string, not {value!r}")
        options = cls(**values)
        options.check_time()
        return options

    def check_time(self) -> None:
        """Refuse a time limit that leaves a job no time to start before SLURM's warning signal
        (sent ``signal_delay`` seconds before the limit); warn about one that leaves little."""
        life = self.time * 60 - self.signal_delay  # seconds from the start to the warning signal
        if life < STARTUP_SECONDS:
            shortest = math.ceil((self.signal_delay + STARTUP_SECONDS) / 60)
            raise UserError(
                f"--slurm-time {self.time} (minutes) leaves a job {max(life, 0)} s before SLURM's "
                f"warning signal (signal_delay = {self.signal_delay} s before the limit), less than the "
                f"{STARTUP_SECONDS} s it needs to start: it would be killed before it could checkpoint. "
                f"Give --slurm-time {shortest} or more, or a smaller signal_delay in the suite's [launcher]"
            )
        if life < SHORT_LIFE_SECONDS:
            warnings.warn(
                f"--slurm-time {self.time} leaves a job {life // 60} min before SLURM's warning signal; "
                "a run resumes after its last finished task, so a task longer than that never finishes",
                stacklevel=2,
            )

    def executor_parameters(self, job_name: str) -> dict[str, Any]:
        """``AutoExecutor.update_parameters`` arguments."""
        parameters: dict[str, Any] = {
            "name": job_name,
            "timeout_min": self.time,
            "cpus_per_task": self.cpus,
            "tasks_per_node": 1,
            "nodes": 1,
            "slurm_array_parallelism": self.array_parallelism,
            "slurm_signal_delay_s": self.signal_delay,
        }
        if self.gpus:
            parameters["gpus_per_node"] = self.gpus
        if self.mem_gb is not None:
            parameters["mem_gb"] = self.mem_gb
        for name in ("partition", "account", "qos", "constraint"):
            if getattr(self, name) is not None:
                parameters[f"slurm_{name}"] = getattr(self, name)
        if self.setup:
            parameters["slurm_setup"] = list(self.setup)
        return parameters


def check_slurm() -> None:
    """SLURM's client tools must be on PATH (submitit submits with sbatch and starts with srun)."""
    missing = [tool for tool in ("sbatch", "srun") if shutil.which(tool) is None]
    if missing:
        raise UserError(
            f"--launcher slurm needs SLURM's {' and '.join(missing)} on PATH, and none was found "
            f"(PATH={os.environ.get('PATH', '')}); run this on a login node of the cluster, or use "
            "--launcher local (one machine) or inline"
        )


class SlurmRun(submitit.helpers.Checkpointable):
    """One run as a SLURM job. ``checkpoint`` (inherited) resubmits the same call: the run's own
    checkpoint, written after every task, is what carries its progress across a requeue."""

    def __call__(self, spec: RunSpec, results_dir: str, options: RunOptions) -> str:
        with heavy_imports():  # a job's process: submitit has unpickled this call, torch not yet imported
            from benchmarks.core.environment import set_deterministic
            from benchmarks.runner.building import resolve

        prepare_runner_process()
        if spec.deterministic:
            set_deterministic(True)  # before any CUDA work
        InlineLauncher().launch([resolve(spec, options.data_root)], ResultStore(results_dir), options)
        return "done"


def _job(folder: Path, job_id: str):
    from submitit.slurm.slurm import SlurmJob

    return SlurmJob(folder=folder, job_id=job_id)


def _alive(folder: Path, job_ids: set[str]) -> set[str]:
    """The jobs that may still run the run they were given: no result file, and SLURM does not say
    they ended (pending, running, requeued, or not known to ``sacct`` yet). One ``sacct`` call."""
    jobs = [_job(folder, job_id) for job_id in sorted(job_ids)]
    if jobs:
        jobs[0].done(force_check=True)  # updates the state of every registered job at once
    return {job.job_id for job in jobs if not job.done()}


def _queued_jobs(store: ResultStore, keys: list[RunKey]) -> dict[RunKey, str]:
    """The SLURM job each run is marked queued in, for the runs that have such a mark."""
    return {
        key: str(record["job_id"]) for key in keys if (record := store.lock(key).read_queued()) is not None
    }


def _give_up_on_stuck_jobs(store: ResultStore, jobs: dict[RunKey, str], slurm: SlurmView) -> set[RunKey]:
    """Cancel the jobs of ``jobs`` that SLURM says can never start, and record each of their runs
    as failed with SLURM's reason (one line each on stderr). Returns those runs."""
    stuck = {
        key: (job_id, info) for key, job_id in jobs.items() if (info := slurm.get(job_id)) and info.never_met
    }
    cancel(job_id for job_id, _ in stuck.values())
    for key, (job_id, info) in stuck.items():
        error = (
            f"SLURM job {job_id} could never start: it pends with reason {info.reason}, because "
            f"{info.never_met}; cancelled"
        )
        store.lock(key).mark_failed(error, job_id)
        print(f"{key}: {error}", file=sys.stderr)
    return set(stuck)


class SlurmLauncher:
    """Submit every run that is not finished, running or queued, as one job array; wait for all of
    them unless ``wait`` is False."""

    def __init__(self, options: SlurmOptions, job_name: str, wait: bool = True):
        self.options, self.job_name, self.wait = options, job_name, wait

    def launch(self, resolved: list[ResolvedRun], store: ResultStore, run_options: RunOptions) -> Outcome:
        runs = [run.spec for run in resolved]  # each job is handed its spec and resolves it there
        hashes = {run.spec.key: run.config_hash for run in resolved}
        options, job_name, wait, quiet = self.options, self.job_name, self.wait, run_options.quiet
        # The job's view: absolute paths (it may start in another folder), no bars, a log per run.
        job_options = replace(
            run_options,
            data_root=str(Path(run_options.data_root).resolve()),
            quiet=True,
            task_lines=True,
            run_logs=True,
            force=False,
        )
        results_dir = str(store.root.resolve())
        check_slurm()
        folder = store.root / ".logs" / "slurm"
        keys = [spec.key for spec in runs]
        slurm = slurm_view(store, keys)
        if _give_up_on_stuck_jobs(store, _queued_jobs(store, keys), slurm):
            slurm = slurm_view(store, keys)  # their runs are failed now, and submitted again below
        states = {spec.key: run_state(store, spec.key, hashes[spec.key], slurm) for spec in runs}
        queued = {
            key: job_id
            for key, job_id in _queued_jobs(store, keys).items()
            if states[key].state != "finished"
        }
        alive = _alive(folder, set(queued.values()))
        held = {key: job_id for key, job_id in queued.items() if job_id in alive}
        # Not submitted: finished runs, runs in a live job, and runs that another runner computes.
        to_submit = [
            spec
            for spec in runs
            if spec.key not in held and states[spec.key].state not in ("finished", "running")
        ]

        submitted: dict[RunKey, str] = {}
        if to_submit:
            executor = submitit.AutoExecutor(
                folder=folder, cluster="slurm", slurm_max_num_timeout=options.max_requeues
            )
            executor.update_parameters(**options.executor_parameters(job_name))
            try:
                with executor.batch():
                    array_jobs = [
                        executor.submit(SlurmRun(), spec, results_dir, job_options) for spec in to_submit
                    ]
            except (
                submitit.core.utils.FailedJobError,
                submitit.core.utils.FailedSubmissionError,
                OSError,
            ) as err:
                lines = [line for line in str(err).splitlines() if line.strip()]
                raise UserError(
                    f"sbatch refused the job array: {lines[-1] if lines else type(err).__name__}"
                ) from None
            for spec, job in zip(to_submit, array_jobs, strict=True):
                store.lock(spec.key).mark_queued(job.job_id)
                submitted[spec.key] = job.job_id
            array = array_jobs[0].job_id.split("_")[0]
            print(
                f"submitted {len(array_jobs)} run(s) as SLURM job array {array} (logs: {folder})",
                file=sys.stderr,
            )
        if held:
            print(
                f"{len(held)} run(s) already queued or running in earlier jobs "
                f"({', '.join(sorted(set(held.values())))}): not submitted again",
                file=sys.stderr,
            )

        watched = {**held, **submitted}
        if not wait:
            finished = [
                key for key, state in states.items() if state.state == "finished"
            ]  # read before submitting
            if len(finished) < len(runs):
                print(
                    f"not waiting: {len(finished)} of {len(runs)} run(s) finished. Watch them with python -m "
                    f"benchmarks.runner.status --results-dir {store.root}; "
                    "rerun this command to collect the results",
                    file=sys.stderr,
                )
            return Outcome(0, finished, show_table=len(finished) == len(runs))

        jobs = {key: _job(folder, job_id) for key, job_id in watched.items()}
        bar = tqdm(total=len(runs), desc="SLURM jobs", disable=quiet, unit="run")
        given_up: set[RunKey] = set()
        try:
            while True:
                slurm = slurm_view(store, keys, also=watched.values())
                given_up |= _give_up_on_stuck_jobs(
                    store, {key: job_id for key, job_id in watched.items() if key not in given_up}, slurm
                )
                states = {spec.key: run_state(store, spec.key, hashes[spec.key], slurm) for spec in runs}
                ended = {
                    key
                    for key, job in jobs.items()
                    if key in given_up or job.done() or ((info := slurm.get(job.job_id)) and info.ended)
                }
                bar.n = sum(state.state == "finished" for state in states.values())
                bar.set_postfix(
                    running=sum(state.state == "running" for state in states.values()),
                    queued=len(jobs) - len(ended) - sum(states[k].state == "running" for k in jobs),
                    failed=sum(state.state == "failed" for state in states.values()),
                    refresh=False,
                )
                bar.refresh()
                if len(ended) == len(jobs) and not any(state.state == "running" for state in states.values()):
                    break
                time.sleep(POLL_SECONDS)
        except KeyboardInterrupt:
            bar.close()
            print(
                "stopped waiting; the jobs keep running "
                f"(scancel {' '.join(sorted(set(watched.values())))} stops "
                "them). Rerun this command to collect the results",
                file=sys.stderr,
            )
            raise
        bar.close()
        finished = [key for key, state in states.items() if state.state == "finished"]
        for key, state in states.items():
            if state.state != "finished":
                its_job = jobs.get(key)
                # no log for a job that never ran
                log = (
                    f"; job log {its_job.paths.stderr}"
                    if its_job is not None and its_job.paths.stderr.exists()
                    else ""
                )
                print(
                    f"{key}: {state.state}{f' ({state.detail})' if state.detail else ''}{log}",
                    file=sys.stderr,
                )
        return Outcome(0 if len(finished) == len(runs) else 2, finished)
