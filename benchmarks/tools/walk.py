"""Walk every real suite with ``--fast-dev-run`` on fake data: ``python -m benchmarks.tools.walk``.

The suite's own check of its real path, without the data, the weights or a GPU: fake data in the
real formats and a random ViT-B-16-quickgelu (``benchmarks.tools.fake_data``, made if the folder
has none), then every strategy of every real suite on its datasets and task counts, one suite
after another, each timed. Prints one row per suite: its finished runs, the run command's exit
code, its wall time. Finished runs are kept, so a rerun after a fix walks only what failed or is left.

``--backbone ViT-L-14`` walks the suites on another open_clip model instead, randomly initialised
(every strategy at its widths: ViT-L/14's 1024 and 768, 24 blocks; ViT-B/32's patch 32): each suite
through a copy of it with that ``[backbone]`` (a variant's own backbone keeps its model).
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
from pathlib import Path

from benchmarks.core.errors import CommandParser, one_line_storage_errors, one_line_user_errors
from benchmarks.data.datasets import FAKE_DATA_MARKER
from benchmarks.runner.reading import iter_results
from benchmarks.tools.fake_data import WEIGHTS_FILE, make_fake_data

REAL_SUITES = ("main", "main-as-published", "seq", "ood", "zeroshot", "ablation", "params", "backbones")


def suite_on(suite: str, model: str, folder: Path) -> str:
    """A suite file that is ``suite`` on a random ``model``: the path of a copy with that
    ``[backbone]``, written in ``folder``."""
    from benchmarks.backbone import check_names

    check_names(model, None)  # one line for a name open_clip does not know
    path = folder / f"{suite}.toml"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f'base = "{suite}"\n\n[backbone]\nmodel = "{model}"\npretrained = "none"\n', encoding="utf-8"
    )
    return str(path)


@one_line_user_errors
def main(argv: list[str] | None = None) -> int:
    from benchmarks import run  # the command line layer: this tool drives it as a user would

    parser = CommandParser(prog="python -m benchmarks.tools.walk", description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", default="fake-data", help="fake data folder (made if missing)")
    parser.add_argument("--results-dir", default="runs/walk", help="one folder per suite under it")
    parser.add_argument("--suites", default=",".join(REAL_SUITES), help="comma-separated suites")
    parser.add_argument("--strategies", help="comma-separated subset of each suite's strategies")
    parser.add_argument("--datasets", help="comma-separated subset of each suite's datasets")
    parser.add_argument("--tasks", help="comma-separated task counts instead of each suite's")
    parser.add_argument(
        "--backbone",
        metavar="MODEL",
        help="walk on this open_clip model, randomly initialised (e.g. ViT-L-14, ViT-B-32), "
        "instead of the fake ViT-B/16 weights",
    )
    args = parser.parse_args(argv)
    root = Path(args.data_root)
    if not (root / FAKE_DATA_MARKER).is_file():
        with one_line_storage_errors("write the fake data", "choose another --data-root"):
            make_fake_data(root)  # refuses a root that holds real data, before writing anything
    rows = ["| suite | finished runs | exit code | wall time |", "|---|---|---|---|"]
    total, failed = 0.0, 0
    for suite in args.suites.split(","):
        results = Path(args.results_dir) / suite
        suite_file = (
            suite_on(suite, args.backbone, Path(args.results_dir) / "suites") if args.backbone else suite
        )
        argv_suite = [
            "--suite",
            suite_file,
            "--fast-dev-run",
            "--data-root",
            str(root),
            "--results-dir",
            str(results),
        ]
        argv_suite += [] if args.backbone else ["--weights", str(root / WEIGHTS_FILE)]
        argv_suite += ["--quiet"]
        for option in ("strategies", "datasets", "tasks"):
            if getattr(args, option):
                argv_suite += [f"--{option}", getattr(args, option)]
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):  # each suite's table: the row below says it
            code = run.main(argv_suite)  # not 0 when a run failed or did not finish
        seconds = time.perf_counter() - start
        total += seconds
        failed += code != 0
        rows.append(
            f"| {suite} | {sum(1 for _ in iter_results(results))} | {code} | {seconds / 60:.1f} min |"
        )
        print(rows[-1], file=sys.stderr)
    rows.append(f"| all | | | {total / 60:.1f} min |")
    print("\n".join(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
