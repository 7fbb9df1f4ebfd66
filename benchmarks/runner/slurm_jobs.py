"""What SLURM says about jobs, asked once for many: ``sacct`` for their state (running, pending,
or how they ended), ``squeue`` for why a pending job waits.

The SLURM launcher and ``benchmarks.runner.status`` use it so that a run is never shown as queued
in a job that has ended: a job killed before Python could record anything (``kill -9``, the OOM
killer, a signal before submitit's handler exists) is reported with SLURM's state, and a job that
pends for a reason SLURM says it can never meet is reported with that reason.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# Job states after which a job runs nothing more (``sacct``'s words; "CANCELLED by 0" reads as CANCELLED).
ENDED_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "TIMEOUT",
    }
)

# Why a pending job may wait forever: SLURM's reason codes that no running job ending can change,
# only an administrator (or new options), each with what the user can do about it.
NEVER_MET_REASONS = {
    "PartitionConfig": "the partition's nodes cannot give what each job asks for "
    "(--slurm-cpus, --slurm-gpus, --slurm-mem-gb)",
    "PartitionTimeLimit": "--slurm-time is longer than the partition allows",
    "BadConstraints": "no node satisfies --slurm-constraint and the resources asked for",
    "InvalidAccount": "--slurm-account is not an account you may use here",
    "InvalidQOS": "--slurm-qos is not a quality of service you may use here",
    "DependencyNeverSatisfied": "a job it depends on failed",
}
# A QOS's or an association's limits on one job (QOSMaxCpuPerJobLimit, AssocMaxWallDurationPerJobLimit).
_PER_JOB_LIMIT = re.compile(r"^(QOS|Assoc)Max\w*PerJob(Limit)?$")

QUERY_TIMEOUT_SECONDS = 60.0
# How srun and slurmstepd say why a task died; their last words after it ("srun: Force Terminated
# StepId=16.0") say less.
_SLURM_ERROR = re.compile(r"^(srun|slurmstepd)(-\S+)?: error:")


@dataclass(frozen=True)
class JobInfo:
    """One job as SLURM reports it."""

    state: str  # SLURM's state word: PENDING, RUNNING, REQUEUED, FAILED, ...
    reason: str = ""  # why a pending job waits (squeue's reason code), "" when it does not

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES

    @property
    def never_met(self) -> str | None:
        """What the user can do, when SLURM says this pending job can never start; else None."""
        if self.state != "PENDING":
            return None
        if self.reason in NEVER_MET_REASONS:
            return NEVER_MET_REASONS[self.reason]
        if _PER_JOB_LIMIT.match(self.reason):
            return "a limit of your QOS or association on one job is lower than what each job asks for"
        return None


class SlurmUnavailable(Exception):
    """SLURM could not be asked (no ``sacct`` on PATH, or it failed)."""


@dataclass(frozen=True)
class SlurmView:
    """What SLURM said about some jobs at one moment; ``unavailable`` says why it could not be
    asked ("" when it was). A job missing from ``jobs`` is one SLURM does not know (yet)."""

    jobs: dict[str, JobInfo]
    unavailable: str = ""

    def get(self, job_id: str | None) -> JobInfo | None:
        return self.jobs.get(job_id) if job_id else None


def _main_ids(job_ids: Iterable[str]) -> list[str]:
    """The array (or single) job ids to ask ``sacct`` about: ``15`` for ``15_0`` and ``15_1``."""
    return sorted({job_id.split("_")[0] for job_id in job_ids})


def _expand(job_id: str) -> list[str]:
    """The job ids a line names: ``15_[0-2,5%2]`` is ``15_0 15_1 15_2 15_5``; others name themselves."""
    match = re.fullmatch(r"(\d+)_\[([\d,\-]+)(%\d+)?\]", job_id)
    if match is None:
        return [job_id]
    ids = []
    for part in match.group(2).split(","):
        first, _, last = part.partition("-")
        ids += [f"{match.group(1)}_{i}" for i in range(int(first), int(last or first) + 1)]
    return ids


def _table(text: str) -> list[dict[str, str]]:
    """Rows of ``--parsable2`` output whose first line names the columns."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    names = lines[0].split("|")
    return [dict(zip(names, line.split("|"), strict=False)) for line in lines[1:]]


def _run(command: list[str]) -> str:
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=QUERY_TIMEOUT_SECONDS, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise SlurmUnavailable(f"{command[0]}: {err}") from None
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise SlurmUnavailable(f"{command[0]}: {lines[-1] if lines else f'exit code {done.returncode}'}")
    return done.stdout


def ask(job_ids: Iterable[str]) -> dict[str, JobInfo]:
    """What SLURM says about ``job_ids`` (``15`` or ``15_0``), in one ``sacct`` call and, for
    pending reasons, one ``squeue`` call. A job SLURM does not know (yet) is left out.
    Raises ``SlurmUnavailable`` when ``sacct`` is missing or fails."""
    wanted = set(job_ids)
    if not wanted:
        return {}
    if shutil.which("sacct") is None:
        raise SlurmUnavailable("sacct is not on PATH")
    main_ids = ",".join(_main_ids(wanted))
    # -X: the jobs themselves, not their steps; the newest record of a requeued job wins.
    found: dict[str, JobInfo] = {}
    for row in _table(_run(["sacct", "-X", "--parsable2", "-o", "JobID,State", "-j", main_ids])):
        state = (row.get("State") or "").split(" ")[0]
        for job_id in _expand(row.get("JobID", "")):
            if job_id in wanted and state:
                found[job_id] = JobInfo(state)
    # squeue knows what the controller knows now (sacct may lag) and why a pending job waits.
    if shutil.which("squeue") is not None:
        try:
            text = _run(["squeue", "--array", "--noheader", "-o", "%i|%T|%r", "-j", main_ids])
        except SlurmUnavailable:  # squeue refuses ids that have all left the controller
            text = ""
        for line in text.splitlines():
            job_id, _, rest = line.strip().partition("|")
            state, _, reason = rest.partition("|")
            if job_id in wanted and state:
                found[job_id] = JobInfo(state, reason if state == "PENDING" else "")
    return found


def view(job_ids: Iterable[str]) -> SlurmView:
    """``ask``, with a failure to ask kept as a note instead of raised."""
    try:
        return SlurmView(ask(job_ids))
    except SlurmUnavailable as err:
        return SlurmView({}, str(err))


def cancel(job_ids: Iterable[str]) -> None:
    """``scancel`` the jobs; a failure is left to the next look at their state."""
    ids = sorted(set(job_ids))
    if ids and shutil.which("scancel") is not None:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=QUERY_TIMEOUT_SECONDS, check=False)


def last_log_line(folder: Path, job_id: str) -> str:
    """Why submitit's job ``job_id`` died, from the end of its stderr under ``folder``: the last
    error line of srun or slurmstepd ("srun: error: node7: task 0: Killed", "slurmstepd: error:
    Detected 1 oom_kill event"), else the last line; "" when there is none."""
    path = Path(folder) / f"{job_id}_0_log.err"
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, 2) - 4096))  # the tail is enough
            lines = [line.strip() for line in handle.read().decode("utf-8", "replace").splitlines()]
    except OSError:
        return ""
    lines = [line for line in lines if line]
    slurm_errors = [line for line in lines if _SLURM_ERROR.match(line)]
    return (slurm_errors or lines or [""])[-1]
