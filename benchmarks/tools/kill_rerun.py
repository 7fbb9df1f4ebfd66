"""Kill -9 a run at random moments, rerun it, and check that nothing was lost or left behind:
``python -m benchmarks.tools.kill_rerun``.

A run that dies (a node lost, an out-of-memory kill, a user's kill -9) must cost nothing but time:
the rerun finishes it, and its result is the one an uninterrupted run gives, with no stray file. The
tool runs a small suite (``SUITE``: fine-tuning and GR4CIL on the tiny CLIP's synthetic world, a few
tasks, the local launcher's two workers, so that a kill also hits a launcher with workers; or
``--suite FILE``, e.g. an outside learner's, with its checkout on ``PYTHONPATH``) once
to the end, then ``--kills`` times into a fresh folder: the command is killed with SIGKILL, with its
whole process group, at a moment drawn uniformly over the first 90 % of the uninterrupted command's
wall time (drawn again, over the killed command's own time, when it had ended before), and then run
again to the end. Each trial checks that:

- every result equals the uninterrupted one: its stages, summary, config hash and predictions
  file, byte for byte (``env`` and ``cost`` record the machine and the time, and may differ);
- nothing is left that a finished folder does not hold: no temp file of an interrupted write, no
  lock, no checkpoint, and no process of the killed command alive.

It prints one Markdown row per trial and a last line ``N of N identical and clean``; the draws come
from ``--seed``. A trial whose kill came after the command had ended is counted apart (nothing was
killed). A mistake in the input is one line and exit 2.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from tqdm.auto import tqdm

from benchmarks.core.atomic_io import write_json
from benchmarks.core.errors import (
    CommandParser,
    UserError,
    one_line_user_errors,
    output_file,
    positive_number,
)

SUITE = """
datasets = ["synthetic"]
tasks = [4]
seeds = [0]
strategies = ["finetune", "gr4cil"]
device = "cpu"
workers = 2
[backbone]
model = "tiny-clip-32"
pretrained = "synthetic"
[dataset.synthetic]
n_train_per_class = 20
n_test_per_class = 6
[defaults]
batch_size = 32
eval_batch_size = 128
lora_rank = 4
lora_alpha = 4.0
epochs = 2
"""
#: what a result may differ in between two runs of the same config: where and when it ran
RECORDS = ("env", "cost")


def _command(suite: Path, results: Path) -> list[str]:
    return [sys.executable, "-m", "benchmarks.run", "--suite", str(suite), "--results-dir", str(results)]


def _run(suite: Path, results: Path, timeout: float) -> float:
    """Run the suite into ``results`` to the end; its wall seconds. A failure, or a run past
    ``timeout`` (stopped with its workers), is one line."""
    start = time.perf_counter()
    process = subprocess.Popen(
        _command(suite, results),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a timeout stops its workers too
    )
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise UserError(
            f"the suite did not finish within --timeout {timeout:g} s; give a longer --timeout "
            "(the seconds one run of the suite to its end may take)"
        ) from None
    if process.returncode != 0:
        last = (stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"the suite did not finish (exit {process.returncode}): {last}")
    return time.perf_counter() - start


def _killed(suite: Path, results: Path, after: float) -> tuple[bool, list[int], float]:
    """Start the suite, SIGKILL its process group after ``after`` seconds; whether it was still
    running, the pids of the group (the command and its workers) at the kill, and the seconds it
    ran."""
    start = time.perf_counter()
    process = subprocess.Popen(
        _command(suite, results), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        process.wait(timeout=after)
        return False, [], time.perf_counter() - start
    except subprocess.TimeoutExpired:
        pass
    try:
        pids = [process.pid, *(child.pid for child in psutil.Process(process.pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        pids = [process.pid]
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    return True, pids, after


def _result_files(results: Path) -> list[Path]:
    """The finished runs' result files under ``results`` (any split and class order)."""
    from benchmarks.runner.results import ResultStore

    return [path for _, path in ResultStore(results).result_files()]


def _finished(results: Path) -> dict[str, dict]:
    """Each result file's content that a rerun must reproduce, and its predictions sidecar's
    SHA-256, by its path under ``results``."""
    from benchmarks.runner.results import predictions_path

    out = {}
    for path in _result_files(results):
        record = json.loads(path.read_text(encoding="utf-8"))
        out[str(path.relative_to(results))] = {k: v for k, v in record.items() if k not in RECORDS}
        if (sidecar := predictions_path(path)).exists():
            out[str(sidecar.relative_to(results))] = {
                "sha256": hashlib.sha256(sidecar.read_bytes()).hexdigest()
            }
    return out


def _strays(results: Path) -> list[str]:
    """Files a finished folder does not hold: temps of interrupted writes, locks, checkpoints."""
    from benchmarks.runner.results import ResultStore

    return [str(path.relative_to(results)) for path in ResultStore(results).leftovers()]


def _alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (a zombie has ended)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def trial(suite: Path, folder: Path, draw, wall: float, reference: dict, timeout: float) -> dict:
    """One kill at a moment ``draw(seconds)`` picks within a run of ``wall`` seconds, and a rerun to
    the end, checked against ``reference``. A command that ended before its kill is run again in a
    fresh folder with a moment drawn over its own time (three tries)."""
    for attempt in range(3):
        results = folder / f"results-{attempt}"
        after = draw(0.9 * wall)
        killed, pids, wall = _killed(suite, results, after)
        if killed:
            break
    time.sleep(1.0)  # a worker hears its launcher's death by a signal and a pipe: give it a moment
    alive = _alive(pids)
    _run(suite, results, timeout)
    got = _finished(results)
    differing = sorted(k for k in reference.keys() | got.keys() if reference.get(k) != got.get(k))
    strays = _strays(results)
    resumed = [  # what each rerun found: [k] resumed after task k, [0] started over, [] nothing to resume
        json.loads(path.read_text(encoding="utf-8"))["cost"].get("resumed_from")
        for path in _result_files(results)
    ]
    return {
        "kill_after_seconds": round(after, 1),
        "killed": killed,
        "resumed_from": resumed,
        "alive_after_kill": alive,
        "differing": differing,
        "strays": strays,
        "ok": not differing and not strays and not alive,
    }


@one_line_user_errors
def _main(argv: list[str] | None) -> int:
    parser = CommandParser(prog="python -m benchmarks.tools.kill_rerun", description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=10, help="trials: kill -9, then rerun (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="draws the kill moments")
    parser.add_argument(
        "--timeout", type=positive_number, default=900.0, help="seconds a run to the end may take"
    )
    parser.add_argument("--out", help="write the trials as JSON here")
    parser.add_argument(
        "--suite", help="a suite file to run instead of the built-in one (e.g. an outside learner's)"
    )
    args = parser.parse_args(argv)
    if args.kills < 1:
        raise UserError(f"--kills must be at least 1, not {args.kills}")
    out = output_file(args.out, "--out")  # before the trials, not after them
    text = SUITE
    if args.suite:
        try:
            text = Path(args.suite).read_text(encoding="utf-8")
        except OSError as err:
            raise UserError(f"--suite {args.suite}: {err.strerror}") from None
    draws = random.Random(args.seed)

    def draw(end: float) -> float:
        return draws.uniform(min(0.5, end), end)

    with tempfile.TemporaryDirectory(prefix="kill-rerun-") as temp:
        root = Path(temp)
        suite = root / "suite.toml"
        suite.write_text(text, encoding="utf-8")
        wall = _run(suite, root / "uninterrupted", args.timeout)
        reference = _finished(root / "uninterrupted")
        rows = []
        for index in tqdm(range(args.kills), desc="kill -9 and rerun", unit="trial"):
            rows.append(trial(suite, root / f"trial-{index}", draw, wall, reference, args.timeout))
    print(f"uninterrupted: {wall:.0f} s, {len(reference)} file(s) to reproduce")
    columns: tuple[str, ...] = (
        "trial",
        "killed after (s)",
        "killed",
        "resumed from",
        "results equal",
        "stray files",
    )
    columns += ("processes left",)
    print("\n| " + " | ".join(columns) + " |")
    print("|---|---|---|---|---|---|---|")
    for index, row in enumerate(rows, 1):
        equal = "yes" if not row["differing"] else ", ".join(row["differing"])
        print(
            f"| {index} | {row['kill_after_seconds']} | {'yes' if row['killed'] else 'no (it had ended)'} "
            f"| {row['resumed_from']} | {equal} | {', '.join(row['strays']) or 'none'} "
            f"| {len(row['alive_after_kill'])} |"
        )
    killed = [row for row in rows if row["killed"]]
    ok = sum(row["ok"] for row in killed)
    print(f"\n{ok} of {len(killed)} killed runs identical and clean ({len(rows) - len(killed)} not killed)")
    if out is not None:
        write_json(out, {"seed": args.seed, "uninterrupted_seconds": wall, "trials": rows})
    return 0 if ok == len(killed) else 1


def main(argv: list[str] | None = None) -> int:
    return _main(argv)


if __name__ == "__main__":
    sys.exit(main())
