"""Check a GPU before spending GPU-days on it: ``python -m benchmarks.tools.gpu_check``.

In under ``--budget-minutes`` (default 8) on one GPU, four phases, each a subprocess with its own
deadline (its share of the budget, plus what the phases before it left unused), so that nothing
hangs and a phase that fails or runs out of time is a row of the table, with its log, never a
traceback:

1. ``tests``: the CUDA tests (``tests/backbone/test_cuda.py``, the only tests that need CUDA; its
   CPU cases of whole runs, marked slow, are left to the test suite);
2. ``speed``: the speed tool's table, each strategy's training step against the bare open_clip
   reference with the same trainable set and against a full fine-tuning step
   (``benchmarks.tools.speed --train``);
3. ``pipeline``: the real runner's training and evaluation against their references
   (``benchmarks.tools.pipeline_speed``); ``benchmarks.run --dry-run`` reads its JSON for GPU-hours;
4. ``fast dev run``: ``main`` on fake CIFAR-100 in its real format and a random ViT-B/16, every
   strategy, 2 tasks (``benchmarks.tools.fake_data``, then ``benchmarks.run --fast-dev-run``).

It prints one Markdown table (phase, what, measured, goal, verdict) and a verdict line, and writes
the raw JSONs, every phase's log and the table under ``--out`` (default ``runs/gpu_check/<date>``),
built in a hidden folder beside it and renamed into place at the end. The goals are issue 49's: each
LoRA strategy's step at least 0.8 of the reference with the same trainable set and at least the
bare full fine-tuning step; the runner's training at least 0.8 and its evaluation at least 0.7 of
their references. Exit code: 0 when every phase ran (goals met or not: the table says which), 1 when
a phase failed or timed out, 2 for a mistake (no CUDA device without ``--device cpu``).

``--device cpu`` runs the same phases on the CPU with the tiny CLIP and small sizes: a check of the
command itself, not of a machine. The phase commands are ``Phase`` values, one place
(``default_phases``), which tests replace with tiny ones.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from benchmarks.core.atomic_io import atomic_write_text
from benchmarks.core.errors import CommandParser, UserError, one_line_storage_errors, one_line_user_errors
from strategies.cards import card_of

#: the repository root: the CUDA tests are run from it, by their path
ROOT = Path(__file__).resolve().parents[2]
CUDA_TESTS = ("tests/backbone/test_cuda.py",)  # grep -rl cuda tests/: no other test needs CUDA
STEP_GOAL, FULL_STEP_GOAL, TRAIN_GOAL, EVAL_GOAL = 0.8, 1.0, 0.8, 0.7


@dataclass(frozen=True)
class Phase:
    """One phase: its commands, run one after another in the repository root under one deadline
    (``share`` of the budget); ``{out}`` in an argument is the output folder, ``{python}`` this
    interpreter. ``read`` turns the folder (and the phase's log) into table rows."""

    name: str
    what: str
    commands: tuple[tuple[str, ...], ...]
    share: float
    read: Callable[[Path, str], list[Row]]


@dataclass(frozen=True)
class Row:
    phase: str
    what: str
    measured: str
    goal: str
    verdict: str  # pass, below goal, failed, timed out, - (no goal)


def default_phases(device: str) -> list[Phase]:
    """The four phases on ``device``: ViT-B/16 at the issue's sizes on CUDA; the tiny CLIP and a
    few steps on the CPU (a test of the command, not a measurement)."""
    py = "{python}"
    sizes: tuple[str, ...] = ()  # the pipeline's own defaults on CUDA: 500 / 100 a class, 2 tasks, 2 epochs
    if device == "cuda":
        model = "ViT-B-16-quickgelu"
        speed: tuple[str, ...] = (
            "--batch-size",
            "64",
            "--warmup",
            "5",
            "--steps",
            "20",
            "--eval-repeats",
            "1",
        )
        run: tuple[str, ...] = ("--suite", "main", "--datasets", "cifar100", "--tasks", "2", "--seeds", "0")
        fake = (
            py,
            "-m",
            "benchmarks.tools.fake_data",
            "--data-root",
            "{out}/fake-data",
            "--datasets",
            "cifar100",
        )
        data = (
            "--data-root",
            "{out}/fake-data",
            "--weights",
            "{out}/fake-data/ViT-B-16-quickgelu-random.safetensors",
        )
        dev_run: tuple[tuple[str, ...], ...] = ((*fake,), (py, "-m", "benchmarks.run", *run, *data))
    else:
        model = "tiny-clip-32"
        speed = ("--strategies", "finetune", "--batch-size", "8", "--warmup", "1", "--steps", "2")
        speed += ("--eval-repeats", "1", "--train-per-class", "4")
        sizes = (
            "--strategies",
            "finetune",
            "--train-per-class",
            "4",
            "--test-per-class",
            "2",
            "--epochs",
            "1",
        )
        run = ("--suite", "smoke", "--strategies", "finetune", "--tasks", "2")
        dev_run = ((py, "-m", "benchmarks.run", *run),)
    tests = (py, "-m", "pytest", "-p", "no:xdist", "-q", "-m", "not slow", *CUDA_TESTS)
    common = ("--device", device, "--model", model)
    finish = ("--fast-dev-run", "--results-dir", "{out}/fast-dev-run", "--device", device, "--quiet")
    return [
        Phase("tests", "CUDA tests", (tests,), 0.15, read_tests),
        Phase(
            "speed",
            "step / reference step with the same trainable set, / full fine-tuning step",
            ((py, "-m", "benchmarks.tools.speed", "--train", *common, *speed, "--out", "{out}/speed.json"),),
            0.35,
            read_speed,
        ),
        Phase(
            "pipeline",
            "runner's training / reference step, evaluation / reference forward",
            ((py, "-m", "benchmarks.tools.pipeline_speed", *common, *sizes, "--out", "{out}/pipeline.json"),),
            0.25,
            read_pipeline,
        ),
        Phase(
            "fast dev run",
            "main, every strategy, 2 tasks, fake CIFAR-100"
            if device == "cuda"
            else "smoke, finetune, 2 tasks",
            tuple((*command, *finish) if "benchmarks.run" in command else command for command in dev_run),
            0.25,
            read_fast_dev_run,
        ),
    ]


# --- reading what a phase left -------------------------------------------------------------------


def _rows_of(path: Path) -> list[dict]:
    """The rows of a tool's JSON: a list, or an object's ``rows``."""
    data = json.loads(path.read_text(encoding="utf-8"))
    rows = data.get("rows") if isinstance(data, dict) else data
    if not isinstance(rows, list):
        raise ValueError(f"{path.name} holds no rows")
    return [row for row in rows if isinstance(row, dict)]


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _get(row: dict, *keys: str) -> float | None:
    """``row[k1][k2]...`` as a number, None where a key is missing or the value is not a number."""
    value: object = row
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return _number(value)


def _ratio(row: dict, key: str, numerator: tuple[str, ...], denominator: tuple[str, ...]) -> float | None:
    """``row[key]``, else the quotient of the two rates it names where both are there."""
    given = _get(row, key)
    if given is not None:
        return given
    top, bottom = _get(row, *numerator), _get(row, *denominator)
    return top / bottom if top is not None and bottom else None


def _show(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _verdict(checks: list[tuple[float | None, float]]) -> str:
    """pass where every measured ratio meets its goal; below goal where one misses; ``-`` where
    one is not measured (a missing key is shown as ``-``, never as a pass)."""
    measured = [(value, goal) for value, goal in checks if value is not None]
    if len(measured) < len(checks):
        return "-"
    return "pass" if all(value >= goal for value, goal in measured) else "below goal"


def read_tests(out: Path, log: str) -> list[Row]:
    """pytest's summary line, e.g. ``7 passed, 5 skipped in 12.3s``."""
    summary = next((line.strip("= ") for line in reversed(log.splitlines()) if " in " in line), "")
    return [Row("tests", "CUDA tests", summary or "see the log", "all pass", "pass")]


def read_speed(out: Path, log: str) -> list[Row]:
    rows = []
    for row in _rows_of(out / "speed.json"):
        strategy = str(row.get("strategy", "?"))
        step = _ratio(
            row,
            "train_over_reference_step",
            ("train_images_per_second",),
            ("reference", "step_images_per_second"),
        )
        full = _ratio(
            row,
            "train_over_full_step",
            ("train_images_per_second",),
            ("reference", "full_step_images_per_second"),
        )
        kind = (
            (row.get("reference") or {}).get("step_kind") if isinstance(row.get("reference"), dict) else None
        )
        measured = (
            f"{_show(_get(row, 'train_images_per_second'), 0)} img/s ({row.get('precision', '-')}): "
            f"{_show(step)} x reference step ({kind or '-'}), {_show(full)} x full step; "
            f"aten ops {_show(_get(row, 'aten_ops', 'ratio'))} x reference"
        )
        if (card := card_of(strategy)) is not None and card.lora:  # the GPU goals name LoRA steps
            goal = f">= {STEP_GOAL} x reference step, >= {FULL_STEP_GOAL:g} x full step"
            verdict = _verdict([(step, STEP_GOAL), (full, FULL_STEP_GOAL)])
        else:
            goal, verdict = "- (not a LoRA strategy)", "-"
        rows.append(Row("speed", strategy, measured, goal, verdict))
    return rows


def read_pipeline(out: Path, log: str) -> list[Row]:
    rows = []
    for row in _rows_of(out / "pipeline.json"):
        train = _ratio(
            row,
            "train_over_reference_step",
            ("train_images_per_second",),
            ("reference_step_images_per_second",),
        )
        evaluation = _ratio(
            row, "eval_over_forward", ("eval_images_per_second",), ("reference_forward_images_per_second",)
        )
        measured = (
            f"train {_show(_get(row, 'train_images_per_second'), 0)} img/s = {_show(train)} x step, "
            f"eval {_show(_get(row, 'eval_images_per_second'), 0)} img/s = {_show(evaluation)} x forward"
        )
        goal = f"train >= {TRAIN_GOAL}, eval >= {EVAL_GOAL}"
        verdict = _verdict([(train, TRAIN_GOAL), (evaluation, EVAL_GOAL)])
        rows.append(Row("pipeline", str(row.get("strategy", "?")), measured, goal, verdict))
    return rows


def read_fast_dev_run(out: Path, log: str) -> list[Row]:
    from benchmarks.runner.results import ResultStore

    finished = ResultStore(out / "fast-dev-run").result_files()
    return [
        Row("fast dev run", "every run end to end", f"{len(finished)} run(s) finished", "all finish", "pass")
    ]


# --- running the phases --------------------------------------------------------------------------


def _run_command(command: list[str], log, deadline: float) -> str | None:
    """Run ``command`` with its output in ``log`` until ``deadline`` (``time.monotonic``); None when
    it exits with 0, else ``failed (exit N)`` or ``timed out``. On time, its whole process group
    (pytest's, the loaders' workers) is killed: it was started in a session of its own."""
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        code = process.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return "timed out"
    except BaseException:  # Ctrl-C: end what this command started, then stop
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    return None if code == 0 else f"failed (exit {code})"


def run_phase(phase: Phase, staging: Path, final: Path, seconds: float) -> list[Row]:
    """Run ``phase``'s commands, writing into ``staging`` (their paths say ``final``, where the
    folder will be), and read its rows; a failure, a timeout or an unreadable result is one row."""
    log_name = f"logs/{phase.name.replace(' ', '-')}.log"
    deadline = time.monotonic() + seconds
    with open(staging / log_name, "w", encoding="utf-8") as log:
        outcome = None
        for command in phase.commands:
            args = [
                part.replace("{out}", str(staging)).replace("{python}", sys.executable) for part in command
            ]
            log.write(f"$ {' '.join(args)}\n")
            log.flush()
            outcome = _run_command(args, log, deadline)
            if outcome is not None:
                break
    text = (staging / log_name).read_text(encoding="utf-8", errors="replace")
    where = f"log: {final / log_name}"
    if outcome is not None:
        limit = f" after {seconds:.0f} s" if outcome == "timed out" else ""
        return [Row(phase.name, phase.what, f"{outcome}{limit}; {where}", "runs", outcome.split(" (")[0])]
    try:
        return phase.read(staging, text) or [
            Row(phase.name, phase.what, f"no rows; {where}", "rows", "failed")
        ]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return [Row(phase.name, phase.what, f"unreadable result ({err}); {where}", "rows", "failed")]


def markdown(rows: list[Row]) -> str:
    lines = ["| phase | what | measured | goal | verdict |", "|---|---|---|---|---|"]
    for row in rows:
        cells = (row.phase, row.what, row.measured, row.goal, row.verdict)
        lines.append("| " + " | ".join(cell.replace("|", "/") for cell in cells) + " |")
    return "\n".join(lines)


def verdict_line(rows: list[Row], device: str) -> str:
    broken = [row for row in rows if row.verdict in ("failed", "timed out")]
    below = [row for row in rows if row.verdict == "below goal"]
    unmeasured = [row for row in rows if row.verdict == "-" and "not a LoRA" not in row.goal]
    if broken:
        names = ", ".join(dict.fromkeys(f"{row.phase} ({row.verdict})" for row in broken))
        return f"verdict: NOT READY: {names}; fix this before a long run (the logs are named in the table)"
    tail = " (a check of the command on the CPU, not of a GPU)" if device == "cpu" else ""
    if below:
        checked = len(below) + sum(row.verdict == "pass" for row in rows)
        return (
            f"verdict: runs, but {len(below)} of {checked} checks are below their speed goal: "
            f"the GPU-hours will be higher than they should{tail}"
        )
    missing = f"; {len(unmeasured)} row(s) not measured (-)" if unmeasured else ""
    return f"verdict: ready: every phase ran and every measured goal is met{missing}{tail}"


def _out_folder(given: str | None) -> Path:
    """``--out`` (refused when it holds anything: nothing of another check is ever replaced), else
    ``runs/gpu_check/<date>``, ``-2``, ``-3``... for a second check the same day."""
    if given is not None:
        folder = Path(given)
        if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
            raise UserError(f"--out {folder} exists and is not an empty folder; give a new one")
        return folder
    base = Path("runs") / "gpu_check" / datetime.date.today().isoformat()
    folder, n = base, 1
    while folder.exists():
        n += 1
        folder = base.with_name(f"{base.name}-{n}")
    return folder


def check(device: str, out: Path, budget_minutes: float, phases: list[Phase]) -> tuple[str, int]:
    """Run ``phases`` into ``out`` (built in a hidden folder beside it, renamed into place at the
    end); returns the table with its verdict line, and the exit code."""
    staging = out.parent / f".{out.name}.partial-{os.getpid()}"
    with one_line_storage_errors("write the check's folder", "free space or give another --out"):
        (staging / "logs").mkdir(parents=True)
    budget, spent, rows = budget_minutes * 60, 0.0, []
    total_share = sum(phase.share for phase in phases) or 1.0
    for index, phase in enumerate(phases):
        allowed = phase.share / total_share * budget
        seconds = allowed + max(0.0, sum(p.share for p in phases[:index]) / total_share * budget - spent)
        print(f"gpu_check: {phase.name} (at most {seconds:.0f} s)", file=sys.stderr, flush=True)
        start = time.monotonic()
        rows += run_phase(phase, staging, out, seconds)
        spent += time.monotonic() - start
    table = markdown(rows) + "\n\n" + verdict_line(rows, device)
    with one_line_storage_errors("write the check's folder", "free space or give another --out"):
        atomic_write_text(staging / "table.md", table + "\n")
        if out.exists():  # an empty folder given as --out
            out.rmdir()
        out.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(out)
    code = 1 if any(row.verdict in ("failed", "timed out") for row in rows) else 0
    return table, code


@one_line_user_errors
def main(argv: list[str] | None = None, phases: list[Phase] | None = None) -> int:
    parser = CommandParser(prog="python -m benchmarks.tools.gpu_check", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default="cuda",
        help="cuda (default); cpu: the same phases with the tiny CLIP, a check of this command",
    )
    parser.add_argument(
        "--budget-minutes", type=float, default=8.0, help="the whole check's deadline (default 8)"
    )
    parser.add_argument("--out", help="where everything goes (default: runs/gpu_check/<date>)")
    args = parser.parse_args(argv)
    if args.budget_minutes <= 0:
        raise UserError(f"--budget-minutes {args.budget_minutes:g} must be positive")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UserError(
                "no CUDA device is visible; run this on the GPU machine (--device cpu checks the command)"
            )
    out = _out_folder(args.out)
    table, code = check(args.device, out, args.budget_minutes, phases or default_phases(args.device))
    print(table)
    print(f"everything is in {out}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
