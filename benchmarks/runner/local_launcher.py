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
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Literal

from tqdm.auto import tqdm

from benchmarks.core.environment import Threads, auto_threads, check_count_or_auto, idle_cores
from benchmarks.core.errors import UserError
from benchmarks.runner.launcher import Outcome, RunOptions, run_log_path
from benchmarks.runner.results import ResultStore, config_hash
from benchmarks.runner.status import RunState, run_state
from benchmarks.runner.suites import RunSpec

POLL_SECONDS = 2.0


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


def auto_workers(workers: Workers, device: str, runs: int) -> int:
    """How many workers to start for ``runs`` runs: as asked, or for "auto" one per idle core on
    the CPU (each run on one thread: ``auto_threads``) and one on CUDA; never more than ``runs``, at
    least one. Idle, not usable: beside another busy process, more workers than the cores left
    free only share them (docs/running.md measures it)."""
    wanted = workers if workers != "auto" else (idle_cores() if device == "cpu" else 1)
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

    def launch(self, runs: list[RunSpec], store: ResultStore, options: RunOptions) -> Outcome:
        from benchmarks.runner.execute import resolve

        hashes = {spec.key: config_hash(resolve(spec, options.data_root)[2]) for spec in runs}
        states = self._states(runs, store, hashes)
        for spec, state in zip(runs, states, strict=True):
            if state.state == "finished":
                tqdm.write(f"{spec.key}: cached; {state.detail}", file=sys.stderr)
        to_compute = sum(state.state != "finished" for state in states)
        if not to_compute:  # nothing for a worker to do: no process started
            return Outcome(0, [spec.key for spec in runs])
        workers = min(self.workers, to_compute)
        logs = store.root / ".logs"
        logs.mkdir(parents=True, exist_ok=True)
        tqdm.write(
            f"{workers} local worker(s) share {to_compute} run(s); each run's log: {logs}", file=sys.stderr
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
        processes = []
        for index in range(workers):
            env = dict(os.environ)
            if self.gpus:
                env["CUDA_VISIBLE_DEVICES"] = str(self.gpus[index % len(self.gpus)])
            log = open(logs / f"local-worker-{index}.log", "w")
            processes.append((subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env), log))
        bar = tqdm(total=len(runs), desc=f"{workers} local workers", disable=options.quiet, unit="run")
        try:
            while True:
                alive = [p for p, _ in processes if p.poll() is None]
                previous, states = states, self._states(runs, store, hashes)
                for spec, before, now in zip(runs, previous, states, strict=True):
                    if now.state != before.state and now.state in ("finished", "failed"):
                        # a line per run as it ends, as the inline launcher writes (a log gets no bar)
                        log = run_log_path(store, spec.key)
                        ended = "ran" if now.state == "finished" else f"failed (log: {log})"
                        tqdm.write(f"{spec.key}: {ended}; {now.detail}", file=sys.stderr)
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
        except KeyboardInterrupt:
            for process, _ in processes:
                process.terminate()
            raise
        finally:
            bar.close()
            for _, log in processes:
                log.close()
        finished = [spec.key for spec, state in zip(runs, states, strict=True) if state.state == "finished"]
        failed = [(i, p.returncode) for i, (p, _) in enumerate(processes) if p.returncode != 0]
        for index, code in failed:
            log = logs / f"local-worker-{index}.log"
            lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
            print(
                f"worker {index} exited with {code}: {lines[-1] if lines else 'no output'} (log: {log})",
                file=sys.stderr,
            )
        return Outcome(2 if failed or len(finished) < len(runs) else 0, finished)

    @staticmethod
    def _states(runs: list[RunSpec], store: ResultStore, hashes: dict) -> list[RunState]:
        return [run_state(store, spec.key, hashes[spec.key]) for spec in runs]
