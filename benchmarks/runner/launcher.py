"""Launchers: where the runs of a suite execute. One interface, three places.

* ``InlineLauncher`` (``--launcher inline``, the default): one run after another in this process.
* ``LocalLauncher`` (``benchmarks.runner.local_launcher``): worker processes on this machine.
* ``SlurmLauncher`` (``benchmarks.runner.slurm_launcher``): one SLURM job per run, as a job array.

Each takes the runs as ``preflight`` resolved them (``ResolvedRun``s: a worker process or a SLURM
job is handed their plain-data ``RunSpec``s and resolves them there), the results store and the
``RunOptions``, and returns an ``Outcome``; the command line (``benchmarks.run``) prints the
results table from it, in one place, whichever launcher ran the runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from tqdm.auto import tqdm

from benchmarks.core.choices import LAUNCHERS as LAUNCHERS
from benchmarks.core.environment import Threads, set_threads
from benchmarks.core.errors import UserError
from benchmarks.core.heartbeat_lock import Holder, read_holder, this_command
from benchmarks.runner.result_record import RunResult
from benchmarks.runner.results import ResultStore, RunKey
from benchmarks.runner.suite_progress import SuiteProgress
from benchmarks.runner.termination import stop_if_terminated

if TYPE_CHECKING:  # the launchers' module stays light: building imports torch, open_clip, Avalanche
    from benchmarks.runner.building import ResolvedRun


@dataclass(frozen=True)
class RunOptions:
    """How the runs of one command execute. Plain data: a SLURM job receives it as it is."""

    data_root: str = "data"
    force: bool = False  # recompute finished runs
    quiet: bool = False  # no progress bars
    task_lines: bool = False  # one line per finished task instead of bars (stderr is not a terminal)
    threads: Threads = "auto"  # torch threads of each run process (benchmarks.core.environment)
    save_models: bool = False  # also save each finished run's learned state
    run_logs: bool = False  # each run's stderr goes to <results-dir>/.logs/<run>.log
    suite_name: str = ""
    log: tuple[str, ...] = ()  # live logs of each run: tensorboard, wandb, csv (benchmarks.runner.live_log)
    reuse_from: tuple[str, ...] = ()  # other results folders whose finished runs are copied, not recomputed


@dataclass(frozen=True)
class Outcome:
    """What a launcher reports: its exit code, the runs finished (now or before), and whether the
    results table belongs on screen (False: SLURM's ``--no-wait`` returned with runs still out)."""

    code: int
    finished: list[RunKey] = field(default_factory=list)
    show_table: bool = True
    failed: list[str] = field(default_factory=list)  # a line for each run (or worker) that failed
    held: list[RunKey] = field(default_factory=list)  # runs another command holds, and computes


def nothing_finished(outcome: Outcome) -> str:
    """The line for a command that finished no run here: the runs that failed, first, or else the
    runs held by other commands (no error: a rerun collects them)."""
    held = f"; {len(outcome.held)} held by another command" if outcome.held else ""
    if outcome.failed:
        first, more = outcome.failed[0], len(outcome.failed) - 1
        return f"no run finished here: {more + 1} failed{held}; the first: {first}" + (
            f" ({more} more above)" if more else ""
        )
    if outcome.held:
        return "no run finished here: every run is held by another command; rerun later to collect them"
    return "no run finished here; the lines above say why"


class Launcher(Protocol):
    def launch(self, runs: list[ResolvedRun], store: ResultStore, options: RunOptions) -> Outcome: ...


def run_log_path(store: ResultStore, key: RunKey) -> Path:
    """Where a run's own log lies (``--run-logs``: the local launcher's workers, SLURM's jobs)."""
    return store.root / ".logs" / key.relpath.with_suffix(".log")


@contextlib.contextmanager
def run_log(store: ResultStore, key: RunKey) -> Iterator[None]:
    """Within the block, this process's stderr (file descriptor 2: Python's and C's writes alike)
    goes to the run's log, appended. ``sys.stderr`` itself is left in place, so a logging handler
    made meanwhile still writes to stderr after the block."""
    path = run_log_path(store, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "a") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        except Exception as err:  # the run's log ends with why it failed
            print(
                f"error: {err}" if isinstance(err, UserError) else f"error: {type(err).__name__}: {err}",
                file=sys.stderr,
            )
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


#: set by the local launcher in a worker's environment: the read end of a pipe whose write end only
#: the launcher holds, so that it reads end-of-file once the launcher is gone, however it ended
PARENT_PIPE_ENV = "CIL_BENCH_LAUNCHER_PIPE"


def watch_launcher() -> None:
    """In a local launcher's worker: end this process (SIGTERM, so its lock is released) once the
    launcher is gone. Linux's ``PR_SET_PDEATHSIG`` does it too (``local_launcher``); the pipe also
    covers the systems that lack it, and a launcher that died before the worker could ask for it."""
    fd = os.environ.pop(PARENT_PIPE_ENV, None)  # not for this worker's own children
    if fd is None or not fd.isdigit():
        return

    def watch() -> None:
        try:
            while os.read(int(fd), 1):
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="launcher watch", daemon=True).start()


def held_elsewhere(store: ResultStore, key: RunKey) -> str:
    """The line for a run another live command holds: the one rule of every launcher (not an error
    of this command: the holder computes it, and a rerun or the holder's table collects it)."""
    return holder_line(read_holder(store.lock(key).path))


def of_this_command(holder: Holder) -> bool:
    """Whether ``holder`` is this command itself or one of its local workers (``this_command``)."""
    return holder.command_pid == this_command()[0] and not holder.damaged


def holder_line(holder: Holder | None) -> str:
    """``held_elsewhere``'s line for a holder already read (None: the lock was gone when read)."""
    if holder is not None and of_this_command(holder):
        return f"computed by another worker of this command ({holder.describe()})"
    return f"computed by another command ({holder.describe() if holder else 'lock released meanwhile'})"


def how_it_ran(result: RunResult) -> str:
    """How a finished run came about, from its result's ``cost.resumed_from``: as the runner's own
    status says it (``benchmarks.runner.learning.resume``)."""
    resumed = result.cost.resumed_from or []
    if not resumed:
        return "ran"
    return "ran again from task 1" if resumed[-1] == 0 else f"resumed after task {resumed[-1]}"


def prepare_runner_process() -> None:
    """What every process that executes runs needs first: warnings as one line for the user, and,
    under forkserver (Linux's default from Python 3.14), loader workers that fork from a server
    that has imported the runner once instead of importing torch and Avalanche (seconds) each."""
    import multiprocessing
    import warnings

    from benchmarks.core.errors import one_line_warning

    warnings.formatwarning = one_line_warning
    multiprocessing.set_forkserver_preload(["benchmarks.runner.execute"])


class InlineLauncher:
    """Every run, one after another, in this process. A run that another process holds is skipped
    (that process computes it: ``held_elsewhere`` names it, and it is no error); the outcome lists
    the runs finished here or found finished."""

    def launch(self, runs: list[ResolvedRun], store: ResultStore, options: RunOptions) -> Outcome:
        from benchmarks.runner.execute import execute  # pulls in torch, Avalanche and the strategies

        finished, held = [], []
        progress = SuiteProgress([run.spec for run in runs])
        for run in tqdm(runs, desc=f"suite {options.suite_name}", disable=options.quiet):
            stop_if_terminated()
            spec = run.spec
            set_threads(options.threads, spec.device)
            began = time.monotonic()
            with run_log(store, spec.key) if options.run_logs else contextlib.nullcontext():
                result, status = execute(
                    run,
                    store,
                    options.data_root,
                    force=options.force,
                    show_progress=not options.quiet,
                    task_lines=options.task_lines,
                    save_model=options.save_models,
                    log=options.log,
                    project=options.suite_name,
                    threads=options.threads,
                    reuse_from=options.reuse_from,
                )
                if result is not None:
                    summary = result.summary
                    status += f"; Avg {summary['avg_acc']:.2f}  Last {summary['last_acc']:.2f}"
                else:  # another command holds the run: it computes it
                    status = held_elsewhere(store, spec.key)
                    held.append(spec.key)
                if options.run_logs:  # the run's own log tells its story too
                    print(f"{spec.key}: {status}", file=sys.stderr)
            computed = result is not None and not status.startswith(("cached", "reused"))
            where = progress.ended(spec, time.monotonic() - began if computed else None)
            tqdm.write(f"{spec.key}: {status} ({where})", file=sys.stderr)
            if result is not None:
                finished.append(spec.key)
        return Outcome(0, finished, held=held)
