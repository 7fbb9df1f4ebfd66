"""The local launcher, ``--launcher local --workers N [--gpus 0,1,...]``: N worker processes on
this machine, each the inline launcher over the same suite and results folder. The run locks
(``benchmarks.runner.locking``) share the runs out: a worker skips a run that another holds or has
finished, so each run is computed once, by whichever worker reaches it first. With ``--gpus`` worker
i sees GPU ``gpus[i % len(gpus)]`` alone (``CUDA_VISIBLE_DEVICES``). Each worker logs every run to
``<results-dir>/.logs/<dataset>/<label>/T<n>-seed<s>.log``; this process shows progress (runs
finished / running / failed; in a log, one line per run as it ends) and prints the table when all
workers end. Each worker runs with ``--threads``: the command's, or for "auto" one on the CPU and a
share of the cores on CUDA (``worker_threads``).

``--workers auto`` (or a suite's ``workers = "auto"``, as the CPU suites have) is one worker per
idle core on the CPU, where each run computes on one thread, and one on CUDA (``auto_workers``);
never more workers than runs to compute. The numbers are the inline launcher's whatever the count:
each run is the same computation in its own process.

Workers end with their launcher. On SIGTERM (``timeout``, a CI cancel, ``kill``) or Ctrl-C the
launcher terminates its workers, waits for them to release their locks (``STOP_SECONDS``, then
kills them) and exits. Where the launcher itself is killed (``kill -9``), each worker is told by
Linux (``prctl(PR_SET_PDEATHSIG, SIGTERM)``, asked in the child before it runs Python) and by a pipe
whose write end only the launcher holds (``launcher.watch_launcher``: end-of-file once it is
gone, on any system), and stops as on SIGTERM, releasing its lock.

Each worker's own log is ``<results-dir>/.logs/local-worker-<i>.<start stamp>-<launcher pid>.log``,
one per command: two commands on one results folder never write or truncate each other's. A run
that another command holds is that command's to compute: it is named with its holder (host, pid,
the command's start), and is no error of this command (exit 0 where every other run finished),
as under the inline launcher.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Literal

from tqdm.auto import tqdm

from benchmarks.core.environment import Threads, auto_threads, check_count_or_auto, idle_cores
from benchmarks.core.errors import UserError
from benchmarks.core.heartbeat_lock import COMMAND_ENV, Holder, read_holder, this_command
from benchmarks.runner.launcher import (
    PARENT_PIPE_ENV,
    Outcome,
    RunOptions,
    held_elsewhere,
    holder_line,
    how_it_ran,
    of_this_command,
    run_log_path,
)
from benchmarks.runner.results import ResultStore, reuse_under_lock, reused_status
from benchmarks.runner.run_key import RunKey
from benchmarks.runner.run_spec import RunSpec
from benchmarks.runner.status import RunState, run_state
from benchmarks.runner.suite_progress import SuiteProgress

if TYPE_CHECKING:  # light until a run computes: building imports torch, open_clip, Avalanche
    from benchmarks.runner.building import ResolvedRun

POLL_SECONDS = 2.0
STOP_SECONDS = 60.0  # how long terminated workers get to release their locks before they are killed
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with(parent: int):
    """A ``preexec_fn``: the worker gets SIGTERM when ``parent`` (the launcher) dies. Runs in the
    child between fork and exec, so it only calls a C function looked up beforehand; where there is
    no ``prctl`` (not Linux) it does nothing and the pipe alone tells the worker."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the launcher died before the request: no signal will come
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def check_gpus(gpus: list[int] | None) -> None:
    if not gpus:
        return
    import torch

    present = torch.cuda.device_count()
    if len(set(gpus)) != len(gpus) or any(g < 0 or g >= present for g in gpus):
        raise UserError(
            f"--gpus {','.join(map(str, gpus))} names GPUs this machine does not have "
            f"({present} visible: {', '.join(map(str, range(present))) or 'none'})"
        )


def worker_argv(argv: list[str]) -> list[str]:
    """The command line of a worker: the user's, without the launcher's own options."""
    out, skip = [], False
    for token in argv:
        if skip:
            skip = False
            continue
        name = token.split("=", 1)[0]
        if name in ("--launcher", "--workers", "--gpus", "--threads"):
            skip = "=" not in token
            continue
        out.append(token)
    return out


#: worker processes of the local launcher: a number, or "auto" (``auto_workers``)
Workers = int | Literal["auto"]


def check_workers(value: object) -> Workers:
    """``value`` (``--workers`` or a suite's ``workers``) as ``Workers``, or one line."""
    return check_count_or_auto(value, "workers")


def sampled_idle_cores(workers: Workers, device: str) -> int | None:
    """The idle cores now, where "auto" workers on the CPU count them; else None (not sampled)."""
    return idle_cores() if workers == "auto" and device == "cpu" else None


def auto_workers(workers: Workers, device: str, runs: int, idle: int | None = None) -> int:
    """How many workers to start for ``runs`` runs: as asked, or for "auto" one per idle core on
    the CPU (each run on one thread: ``auto_threads``) and one on CUDA; never more than ``runs``, at
    least one. Idle, not usable: beside another busy process, more workers than the cores left
    free only share them (docs/running.md measures it). ``idle``: the idle cores, where the caller
    has sampled them already (to say so); else they are sampled here."""
    if workers != "auto":
        wanted = workers
    elif device != "cpu":
        wanted = 1
    else:
        wanted = idle if idle is not None else idle_cores()
    return max(1, min(wanted, runs))


def worker_threads(threads: Threads, workers: int, device: str) -> Threads:
    """Each worker's torch threads: as asked, or for "auto" ``auto_threads`` shared out among the
    workers. "auto" itself where the share is what "auto" gives one process (one thread on the CPU,
    whatever the number of workers), so each result records the setting the command was given."""
    if threads != "auto":
        return threads
    share = max(1, auto_threads(device) // workers)
    return "auto" if share == auto_threads(device) else share


class LocalLauncher:
    """``workers`` copies of this command (``argv``, the user's command line) with the inline
    launcher, sharing the runs through their locks."""

    def __init__(self, argv: list[str], workers: int, gpus: list[int] | None = None):
        self.argv, self.workers, self.gpus = argv, workers, gpus

    def launch(self, resolved: list[ResolvedRun], store: ResultStore, options: RunOptions) -> Outcome:
        runs = [run.spec for run in resolved]  # each worker expands and resolves them again, its own
        hashes = {run.spec.key: run.config_hash for run in resolved}
        states = self._states(runs, store, hashes)
        if options.reuse_from and not (options.force or options.save_models):
            for spec, state in zip(runs, states, strict=True):
                if state.state not in ("finished", "running") and (
                    found := reuse_under_lock(store, spec.key, hashes[spec.key], options.reuse_from)
                ):
                    tqdm.write(f"{spec.key}: {reused_status(found[1])}", file=sys.stderr)
            states = self._states(runs, store, hashes)
        to_compute = sum(state.state != "finished" for state in states)
        workers = max(1, min(self.workers, to_compute))
        progress = SuiteProgress(runs, workers)
        for spec, state in zip(runs, states, strict=True):
            if state.state == "finished":
                tqdm.write(
                    f"{spec.key}: cached; {state.detail} ({progress.ended(spec, None)})", file=sys.stderr
                )
        if not to_compute:  # nothing for a worker to do: no process started
            return Outcome(0, [spec.key for spec in runs])
        logs = store.root / ".logs"
        logs.mkdir(parents=True, exist_ok=True)
        command_pid, started = this_command()
        stamp = f"{time.strftime('%Y%m%d-%H%M%S', time.localtime(started))}-{command_pid}"
        tqdm.write(
            f"{workers} local worker(s) share {to_compute} run(s); each run's log: {logs}, each worker's: "
            f"{logs}/local-worker-<i>.{stamp}.log",
            file=sys.stderr,
        )
        command = [
            sys.executable,
            "-m",
            "benchmarks.run",
            *worker_argv(self.argv),
            "--launcher",
            "inline",
            "--threads",
            str(worker_threads(options.threads, workers, runs[0].device)),
            "--run-logs",
            "--results-dir",
            str(store.root),
        ]
        processes, paths = [], []
        watch, alive_end = os.pipe()  # the workers read end-of-file once this process is gone
        try:
            for index in range(workers):
                env = {**os.environ, PARENT_PIPE_ENV: str(watch), COMMAND_ENV: f"{command_pid} {started}"}
                if self.gpus:
                    env["CUDA_VISIBLE_DEVICES"] = str(self.gpus[index % len(self.gpus)])
                paths.append(logs / f"local-worker-{index}.{stamp}.log")
                log = open(paths[-1], "a")  # "a": never another command's log truncated
                worker = subprocess.Popen(
                    command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    pass_fds=(watch,),
                    preexec_fn=_die_with(os.getpid()),
                )
                processes.append((worker, log))
            return self._watch(runs, store, options, hashes, states, processes, paths, progress)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM (``termination.Terminated``): the workers end first
            _stop(processes)
            raise
        finally:
            os.close(watch)
            os.close(alive_end)
            for _, log in processes:
                log.close()

    def _watch(self, runs, store, options, hashes, states, processes, paths, progress) -> Outcome:
        """Show progress until every worker has ended; the outcome, with the runs held by another
        command named (not an error) and the workers that failed named with their log's last line."""
        bar = tqdm(
            total=len(runs), desc=f"{progress.workers} local workers", disable=options.quiet, unit="run"
        )
        others: dict = {}  # run -> the line naming the other command last seen holding it
        try:
            while True:
                alive = [p for p, _ in processes if p.poll() is None]
                previous, states = states, self._states(runs, store, hashes)
                for spec, before, now in zip(runs, previous, states, strict=True):
                    if now.state == "running":
                        note_other_command(others, spec.key, read_holder(store.lock(spec.key).path))
                    if now.state != before.state and now.state in ("finished", "failed"):
                        # a line per run as it ends, as the inline launcher writes (a log gets no bar)
                        log = run_log_path(store, spec.key)
                        seconds = None  # a run computed by another command, or failed, teaches no time
                        if now.state == "finished":
                            result = store.finished(spec.key, hashes[spec.key])
                            # resumed: said so
                            ended = others.get(spec.key) or (how_it_ran(result) if result else "ran")
                            if spec.key not in others and result is not None:
                                seconds = result.cost.train_seconds + result.cost.eval_seconds
                        else:
                            ended = f"failed (log: {log})"
                        where = progress.ended(spec, seconds)
                        tqdm.write(f"{spec.key}: {ended}; {now.detail} ({where})", file=sys.stderr)
                bar.n = sum(state.state == "finished" for state in states)
                bar.set_postfix(
                    running=sum(state.state == "running" for state in states),
                    failed=sum(state.state == "failed" for state in states),
                    refresh=False,
                )
                bar.refresh()
                if not alive:
                    break
                time.sleep(POLL_SECONDS)
        finally:
            bar.close()
        finished = [spec.key for spec, state in zip(runs, states, strict=True) if state.state == "finished"]
        # every worker has ended: a run still running is another command's, which computes it
        elsewhere = [spec for spec, state in zip(runs, states, strict=True) if state.state == "running"]
        for spec in elsewhere:
            tqdm.write(f"{spec.key}: {held_elsewhere(store, spec.key)}", file=sys.stderr)
        failed = [(i, p.returncode) for i, (p, _) in enumerate(processes) if p.returncode != 0]
        workers_failed = []
        for index, code in failed:
            log = paths[index]
            lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
            workers_failed.append(
                f"worker {index} exited with {code}: {lines[-1] if lines else 'no output'} (log: {log})"
            )
            print(workers_failed[-1], file=sys.stderr)
        runs_failed = [
            f"{spec.key}: {state.detail} (log: {run_log_path(store, spec.key)})"
            for spec, state in zip(runs, states, strict=True)
            if state.state == "failed"
        ]
        return Outcome(
            2 if failed or len(finished) + len(elsewhere) < len(runs) else 0,
            finished,
            failed=runs_failed or workers_failed,
            held=[spec.key for spec in elsewhere],
        )

    @staticmethod
    def _states(runs: list[RunSpec], store: ResultStore, hashes: dict) -> list[RunState]:
        return [run_state(store, spec.key, hashes[spec.key]) for spec in runs]


def note_other_command(others: dict, key: RunKey, holder: Holder | None) -> None:
    """Keep in ``others`` the line of another command seen holding ``key`` (its run ends as that
    command's), or forget it once this command's worker holds it. None (the lock released since the
    run's state was read, by whichever worker or command computed it) changes nothing: the run is
    not said to be another command's for having ended between two reads."""
    if holder is None:
        return
    if of_this_command(holder):
        others.pop(key, None)
    else:
        others[key] = holder_line(holder)


def _stop(processes: list) -> None:
    """Terminate the workers and wait for them to release their locks (``STOP_SECONDS`` in all);
    kill the ones still there, so that no worker outlives its launcher."""
    for process, _ in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + STOP_SECONDS
    for process, _ in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
