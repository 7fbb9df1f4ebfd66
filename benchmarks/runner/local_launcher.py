"""The local launcher, ``--launcher local --workers N [--gpus 0,1,...]``: N worker processes on
this machine, each the inline launcher over the same suite and results folder. The run locks
(``benchmarks.runner.locking``) share the runs out: a worker skips a run that another holds or has
finished, so each run is computed once, by whichever worker reaches it first. With ``--gpus`` worker
i sees GPU ``gpus[i % len(gpus)]`` alone (``CUDA_VISIBLE_DEVICES``). Each worker logs every run to
``<results-dir>/.logs/<dataset>/<label>/T<n>-seed<s>.log``; this process shows progress (runs
finished / running / failed) and prints the table when all workers end. Each worker runs with
``--threads``: the command's, or for "auto" one on the CPU and a share of the cores on CUDA
(``worker_threads``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tqdm.auto import tqdm

from benchmarks.core.environment import Threads, auto_threads
from benchmarks.core.errors import UserError
from benchmarks.runner.launcher import Outcome, RunOptions
from benchmarks.runner.results import ResultStore, config_hash
from benchmarks.runner.status import run_state
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


def worker_threads(threads: Threads, workers: int, device: str) -> int:
    """Each worker's torch threads: as asked, or for "auto" ``auto_threads``, shared out among the
    workers (one each on the CPU)."""
    return threads if threads != "auto" else max(1, auto_threads(device) // workers)


class LocalLauncher:
    """``workers`` copies of this command (``argv``, the user's command line) with the inline
    launcher, sharing the runs through their locks."""

    def __init__(self, argv: list[str], workers: int, gpus: list[int] | None = None):
        self.argv, self.workers, self.gpus = argv, workers, gpus

    def launch(self, runs: list[RunSpec], store: ResultStore, options: RunOptions) -> Outcome:
        from benchmarks.runner.execute import resolve

        hashes = {spec.key: config_hash(resolve(spec, options.data_root)[2]) for spec in runs}
        workers, gpus, quiet = self.workers, self.gpus, options.quiet
        logs = store.root / ".logs"
        logs.mkdir(parents=True, exist_ok=True)
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
            if gpus:
                env["CUDA_VISIBLE_DEVICES"] = str(gpus[index % len(gpus)])
            log = open(logs / f"local-worker-{index}.log", "w")
            processes.append((subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env), log))
        bar = tqdm(total=len(runs), desc=f"{workers} local workers", disable=quiet, unit="run")
        try:
            while True:
                alive = [p for p, _ in processes if p.poll() is None]
                states = [run_state(store, spec.key, hashes[spec.key]).state for spec in runs]
                bar.n = states.count("finished")
                bar.set_postfix(running=states.count("running"), failed=states.count("failed"), refresh=False)
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
        finished = [spec.key for spec, state in zip(runs, states, strict=True) if state == "finished"]
        failed = [(i, p.returncode) for i, (p, _) in enumerate(processes) if p.returncode != 0]
        for index, code in failed:
            log = logs / f"local-worker-{index}.log"
            lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
            print(
                f"worker {index} exited with {code}: {lines[-1] if lines else 'no output'} (log: {log})",
                file=sys.stderr,
            )
        return Outcome(2 if failed or len(finished) < len(runs) else 0, finished)
