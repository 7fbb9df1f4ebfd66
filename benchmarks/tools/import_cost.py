"""The CPU time a fresh process spends importing, with the garbage collector running and paused
(``benchmarks.core.imports.heavy_imports``): ``python -m benchmarks.tools.import_cost``.

Two imports, each in fresh processes taken in turn, ``--repeats`` times: the reference, the
packages a run imports and none of this suite's code (``--modules``: torch, Avalanche's training
package, open_clip, peft), and the runner (``benchmarks.run_suite``). Each once as Python imports
it and once inside ``heavy_imports``. Prints one Markdown row per cell: the median CPU seconds
(user and system, the process's own), and the paused cell's ratio to the unpaused one beside it.
"""

from __future__ import annotations

import statistics
import subprocess
import sys

from tqdm.auto import tqdm

from benchmarks.core.errors import CommandParser, UserError, one_line_user_errors

REFERENCE = "torch,avalanche.training,open_clip,peft"
RUNNER = "benchmarks.run_suite"
CODE = """
import contextlib, os, sys
from benchmarks.core.imports import heavy_imports
paused = sys.argv[1] == "paused"
with heavy_imports() if paused else contextlib.nullcontext():
    for module in sys.argv[2].split(","):
        __import__(module)
times = os.times()
print(times.user + times.system)
"""


def cpu_seconds(modules: str, paused: bool) -> float:
    """The CPU seconds of one fresh process that imports ``modules`` (comma-separated)."""
    done = subprocess.run(
        [sys.executable, "-c", CODE, "paused" if paused else "running", modules],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"importing {modules} failed: {last}")
    return float(done.stdout.split()[-1])


def measure(imports: dict[str, str], repeats: int) -> dict[tuple[str, bool], list[float]]:
    """Each (name, paused) cell's CPU seconds, ``repeats`` fresh processes each, taken in turn."""
    cells = [(name, paused) for name in imports for paused in (False, True)]
    seconds: dict[tuple[str, bool], list[float]] = {cell: [] for cell in cells}
    with tqdm(total=len(cells) * repeats, desc="fresh processes", unit="process") as bar:
        for _ in range(repeats):
            for name, paused in cells:
                seconds[(name, paused)].append(cpu_seconds(imports[name], paused))
                bar.update()
    return seconds


def table(seconds: dict[tuple[str, bool], list[float]]) -> str:
    rows = ["| imports | collector | CPU s (median) | n | / running |", "|---|---|---:|---:|---:|"]
    for (name, paused), values in seconds.items():
        median = statistics.median(values)
        ratio = median / statistics.median(seconds[(name, False)])
        state = "paused, then frozen" if paused else "running"
        rows.append(f"| {name} | {state} | {median:.2f} | {len(values)} | {ratio:.2f} |")
    return "\n".join(rows)


@one_line_user_errors
def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="python -m benchmarks.tools.import_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per cell (default 5)")
    parser.add_argument("--modules", default=REFERENCE, help=f"the reference's modules (default {REFERENCE})")
    parser.add_argument("--runner", default=RUNNER, help=f"the runner's module (default {RUNNER})")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        raise UserError(f"--repeats must be at least 1, not {args.repeats}")
    imports = {f"reference ({args.modules})": args.modules, args.runner: args.runner}
    print(table(measure(imports, args.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
