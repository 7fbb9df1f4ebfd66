"""Where every run of a results folder stands: finished, running, queued, partial, failed or to run.

``python -m benchmarks.runner.status --results-dir DIR`` prints one row per run found in DIR: finished
(with Avg/Last), running (host, pid or job id, since when), queued (its SLURM job), partial (tasks
done), failed (the error its last attempt recorded), refused (a file at its result's path that the
runner will not replace unsaid, named with why: ``ResultStore.refusal``). ``benchmarks.run
--dry-run`` uses the same states for the runs of a suite, adding "to run".

A run marked queued in a SLURM job is shown as queued only while SLURM (``sacct``, ``squeue``)
holds that job: a job that ended without the run's own record of it (killed by ``kill -9`` or the
OOM killer) makes the run failed, with SLURM's state and the job log's last line, and a job pending
for a reason it can never meet says so.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace

from benchmarks.core.atomic_io import read_json_object
from benchmarks.core.errors import CommandParser, UserError, one_line_user_errors, results_folder
from benchmarks.core.heartbeat_lock import is_stale, read_holder
from benchmarks.runner.results import ResultStore, RunKey
from benchmarks.runner.slurm_jobs import SlurmView, last_log_line, view

STATES = ("finished", "running", "queued", "partial", "failed", "refused", "to run")


@dataclass(frozen=True)
class RunState:
    state: str  # one of STATES
    detail: str = ""
    tasks_done: int = 0


def slurm_view(store: ResultStore, keys: Iterable[RunKey], also: Iterable[str] = ()) -> SlurmView:
    """What SLURM says about the jobs that the runs ``keys`` are queued in or held by, and the
    jobs ``also``, asked once."""
    job_ids = set(also)
    for key in keys:
        lock = store.lock(key)
        if (queued := lock.read_queued()) is not None:
            job_ids.add(str(queued.get("job_id")))
            if (holder := read_holder(lock.path)) is not None and holder.job_id:
                job_ids.add(holder.job_id)
    return view(job_ids)


def run_state(
    store: ResultStore, key: RunKey, cfg_hash: str | None = None, slurm: SlurmView | None = None
) -> RunState:
    """The state of one run; with ``cfg_hash``, results and checkpoints of another config do not count.
    A run marked queued is checked against SLURM: ``slurm`` (from ``slurm_view``, for many runs at
    once) or, when not given, one question about its own job."""
    lock = store.lock(key)
    holder = read_holder(lock.path)
    queued = lock.read_queued()
    if queued is not None and slurm is None:
        slurm = slurm_view(store, [key])
    checkpoint = _checkpoint(store, key, cfg_hash)
    done = checkpoint.get("tasks_done", 0)
    if holder is not None and not is_stale(holder):
        job = slurm.get(holder.job_id) if slurm is not None else None
        if job is None or not job.ended:  # a job SLURM says has ended holds nothing any more
            progress = f", {done}/{key.n_tasks} tasks done" if done else ""
            return RunState("running", holder.describe() + progress, done)
    if (refused := store.refusal(key, cfg_hash)) is not None:  # what the runner would stop at
        return RunState("refused", refused, done)
    if (result := store.finished(key, cfg_hash)) is not None:
        summary = result.summary
        return RunState(
            "finished", f"Avg {summary['avg_acc']:.2f}  Last {summary['last_acc']:.2f}", key.n_tasks
        )
    kept = f"; {done}/{key.n_tasks} tasks kept" if done else ""
    # a stale lock is no holder, but a damaged one is named: someone may want to know why it is there
    stale = f"; {holder.describe()}" if holder is not None and holder.damaged else ""
    if queued is not None and slurm is not None:  # a queued run's view was asked above
        job_id = str(queued.get("job_id"))
        job = slurm.get(job_id)
        error = _error(lock)
        recorded = error is not None and error.get("when", 0) >= queued.get("submitted", 0)
        if job is not None and job.ended and not recorded:
            # killed before Python could record why (kill -9, the OOM killer): SLURM and srun tell
            line = last_log_line(store.root / ".logs" / "slurm", job_id) or "no job log"
            return RunState("failed", f"SLURM job {job_id} {job.state}: {line}{kept}", done)
        if job is None or not job.ended:
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(queued.get("submitted", 0)))
            said, advice = "", ""
            if job is None:
                said = f" (SLURM not asked: {slurm.unavailable})" if slurm.unavailable else ""
            else:
                said = f" {job.state}{f' ({job.reason})' if job.reason and job.reason != 'None' else ''}"
            if job is not None and job.never_met:
                advice = (
                    f"; it can never start: {job.never_met}; scancel {job_id}, or rerun the command "
                    "with other options"
                )
            progress = f"; {done}/{key.n_tasks} tasks done" if done else ""
            return RunState("queued", f"SLURM job {job_id}{said}, submitted {since}{progress}{advice}", done)
    if (error := _error(lock)) is not None:
        where = error.get("job_id") or error.get("pid")
        return RunState(
            "failed",
            f"{error.get('error', '?')} ({error.get('host', '?')}, {where}{kept})",
            done,
        )
    if done:
        return RunState("partial", f"{done}/{key.n_tasks} tasks done{stale}", done)
    return RunState("to run", stale.removeprefix("; "))


def _error(lock) -> dict | None:
    """The error record of the run's last failed attempt, or None (none, or a damaged one)."""
    return read_json_object(lock.error_path, error=str, when=(int, float))


def _checkpoint(store: ResultStore, key: RunKey, cfg_hash: str | None) -> dict:
    state = read_json_object(store.checkpoint_state_path(key), tasks_done=int) or {}
    return state if cfg_hash in (None, state.get("config_hash")) else {}


def known_runs(store: ResultStore) -> list[RunKey]:
    """Every run that has a result, a checkpoint, a lock, an error or a queued record in the store
    (``ResultStore.run_keys``). A folder holds ``safe_label(label)``; where a result gives the label
    itself, the key has it."""
    labels: dict[tuple[str, str], str] = {}
    for path, result in store.results(skipped=[]):  # each at its place: <dataset>/<safe label>/
        labels[(path.parent.parent.name, path.parent.name)] = result.label
    runs = {replace(k, label=labels.get((k.dataset, k.label), k.label)) for k in store.run_keys()}
    return sorted(runs, key=lambda k: (k.dataset, k.label, k.split, k.n_tasks, k.order, k.seed))


def status_table(store: ResultStore) -> str:
    keys = known_runs(store)
    if not keys:
        raise UserError(f"no runs under {store.root}; give the --results-dir of a suite")
    lines = ["| run | state | detail |", "|---|---|---|"]
    counts = dict.fromkeys(STATES, 0)
    slurm = slurm_view(store, keys)
    for key in keys:
        state = run_state(store, key, slurm=slurm)
        counts[state.state] += 1
        lines.append(f"| {key} | {state.state} | {state.detail} |")
    lines.append("")
    lines.append(", ".join(f"{n} {state}" for state, n in counts.items() if n))
    return "\n".join(lines)


@one_line_user_errors
def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="python -m benchmarks.runner.status", description=__doc__.split("\n")[0])
    parser.add_argument("--results-dir", required=True, help="the results folder of one or more suites")
    args = parser.parse_args(argv)
    root = results_folder(args.results_dir)
    print(status_table(ResultStore(root)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
