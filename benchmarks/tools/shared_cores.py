"""The smoke suite's wall time by torch thread count and by runs at once, on an idle machine and
beside another busy process: ``python -m benchmarks.tools.shared_cores``.

Each cell is one fresh ``python -m benchmarks.run --suite smoke`` (a new results folder, so nothing
is cached) with ``--threads`` and ``--workers`` set as named; workers "1" is the inline launcher (one
run after another in the command's process), "auto" the suite's own setting (one run per idle core).
"loaded" starts a second process first, a float matmul loop on torch's default threads (every
core), as another user's job would run, and stops it after. Prints one Markdown row per cell, with
the runs it ran at once (its local workers, as the command says) and the ratio to the first idle
cell at ``--threads auto``: the ceiling measured beside it.
``--strategies`` runs a subset of the suite; ``--timeout`` ends a cell that runs longer (its row
says so and gives the tasks it had finished).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tqdm.auto import tqdm

from benchmarks.core.atomic_io import read_json_object
from benchmarks.core.environment import check_threads, usable_cores
from benchmarks.core.errors import CommandParser, UserError, one_line_user_errors
from benchmarks.runner.local_launcher import check_workers
from benchmarks.runner.results import ResultStore

BUSY = "import torch\na = torch.randn(384, 384)\nwhile True:\n    a = (a @ a).clamp_(-1, 1)\n"


def _finished_tasks(folder: Path) -> int:
    """Tasks finished under ``folder``: every finished run's, and every checkpoint's."""
    store = ResultStore(folder)
    finished = sum(len(result.stages) for _, result in store.results())
    return finished + sum(
        (read_json_object(path, tasks_done=int) or {"tasks_done": 0})["tasks_done"]
        for _, path in store.checkpoint_states()
    )


def time_smoke(
    threads: str, loaded: bool, strategies: str | None, timeout: float, workers: str = "1"
) -> dict:
    """One cell: the smoke suite's wall time (s) at ``--threads threads`` with ``workers`` runs at
    once, beside a busy process if ``loaded``; ``None`` seconds when it ran past ``timeout``."""
    busy = subprocess.Popen([sys.executable, "-c", BUSY]) if loaded else None
    try:
        with tempfile.TemporaryDirectory(prefix="shared-cores-") as results:
            command = [sys.executable, "-m", "benchmarks.run", "--suite", "smoke", "--quiet"]
            command += ["--results-dir", results, "--threads", threads]
            command += ["--launcher", "inline"] if workers == "1" else ["--workers", workers]
            command += ["--strategies", strategies] if strategies else []
            start = time.perf_counter()
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
                seconds: float | None = time.perf_counter() - start
            except subprocess.TimeoutExpired:
                done, seconds = None, None
            if done is not None and done.returncode != 0:
                lines = done.stderr.strip().splitlines() or ["no output"]
                raise UserError(
                    f"the smoke suite at --threads {threads} --workers {workers} failed: {lines[-1]}"
                )
            tasks = _finished_tasks(Path(results))
            started = _workers_started(done.stderr if done is not None else "")
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    return {
        "threads": threads,
        "workers": workers,
        "started": started,
        "loaded": loaded,
        "seconds": seconds,
        "tasks": tasks,
    }


def _workers_started(stderr: str) -> int:
    """The runs at once of a finished command: its local workers, as it says; 1 inline."""
    found = re.search(r"^(\d+) local worker\(s\) share", stderr, re.MULTILINE)
    return int(found.group(1)) if found else 1


@one_line_user_errors
def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="python -m benchmarks.tools.shared_cores", description=__doc__.split("\n")[0])
    parser.add_argument("--threads", default="auto,1,2", help="comma-separated --threads values (auto,1,2)")
    parser.add_argument(
        "--workers", default="1", help='comma-separated --workers values: 1 (inline), a number or "auto" (1)'
    )
    parser.add_argument("--load", default="idle,loaded", help="idle, loaded or both (idle,loaded)")
    parser.add_argument("--strategies", help="a subset of the smoke suite's strategies (default: all five)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds a cell may run (3600)")
    parser.add_argument("--out", help="also write the cells as JSON here")
    args = parser.parse_args(argv)
    parser.output_file(args.out)  # before the work, not after it
    threads = [str(check_threads(value)) for value in args.threads.split(",")]
    workers = [str(check_workers(value)) for value in args.workers.split(",")]
    if not set(loads := args.load.split(",")) <= {"idle", "loaded"}:
        raise UserError(f"--load takes idle, loaded or both, not {args.load!r}")
    plan = [(t, w, load == "loaded") for load in loads for w in workers for t in threads]
    cells = [
        time_smoke(t, loaded, args.strategies, args.timeout, w) for t, w, loaded in tqdm(plan, desc="cells")
    ]
    ceiling = next((c["seconds"] for c in cells if not c["loaded"] and c["threads"] == "auto"), None)
    print(f"smoke suite{' (' + args.strategies + ')' if args.strategies else ''}, {usable_cores()} cores")
    print("| machine | --threads | --workers | runs at once | wall time (s) | tasks finished | / ceiling |")
    print("|---|---|---|---|---|---|---|")
    for cell in cells:
        seconds = cell["seconds"]
        wall = f"{seconds:.0f}" if seconds is not None else f"over {args.timeout:.0f}"
        ratio = f"{seconds / ceiling:.2f}" if seconds is not None and ceiling else "-"
        machine = "loaded" if cell["loaded"] else "idle"
        print(
            f"| {machine} | {cell['threads']} | {cell['workers']} | {cell['started']} | {wall} "
            f"| {cell['tasks']} | {ratio} |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(cells, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
