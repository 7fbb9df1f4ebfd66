"""REPRODUCIBILITY.md: one row per strategy, built from result JSON.

Columns: the paper's row label (docs/decisions.md D9); where its recipe comes from; what is verified
offline (its tests, and its Avg/Last on the miniature, from the ``smoke-baselines`` results kept
under ``results/``); how many of its components equal the official code, by execution, and the
largest difference (the table of docs/baselines.md §16, tested against the golden fixtures); the
paper's Table 1 numbers; and the numbers reproduced on real data, from every result of a paper
dataset found, or "not yet run".

``python -m analysis.reproducibility --results-dir results --out REPRODUCIBILITY.md`` writes the
file; ``python -m analysis.report`` writes one beside its tables as well.
"""

from __future__ import annotations

import functools
import re
import sys
from collections import defaultdict
from pathlib import Path
from statistics import fmean

import numpy as np

from analysis.formatting import mean_std_cell, population_std
from analysis.paper_inputs import (
    DATASET_NAMES,
    PAPER_DATASETS,
    PAPER_METHOD_NAMES,
    load_paper_reference,
    row_label,
    split_of,
)
from benchmarks.core.atomic_io import atomic_write_text
from benchmarks.core.errors import CommandParser, UserError, results_folder
from benchmarks.runner.reading import Results, read_results, result_folders
from benchmarks.runner.result_record import RunResult
from strategies.cards import cards

MINIATURE = "synthetic"
BASELINES_MD = Path(__file__).resolve().parents[1] / "docs" / "baselines.md"
EQUALITY_SECTION = "## 16. "


def official_equality(path: Path = BASELINES_MD) -> list[dict]:
    """The rows of docs/baselines.md §16: ``component``, ``strategies``, ``official``, ``max_diff``
    (float), ``tolerance`` and ``verdict``; [] where the file is not there (an installed copy)."""
    if not path.is_file():
        return []
    text = path.read_text()
    start = text.find(EQUALITY_SECTION)
    if start < 0:
        return []
    end = text.find("\n## ", start + 1)
    section = text[start : end if end >= 0 else None]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 7 and re.fullmatch(r"`[\w.]+`", cells[0]):
            rows.append(
                {
                    "component": cells[0].strip("`"),
                    "strategies": [name.strip("` ") for name in cells[1].split(",")],
                    "official": cells[2],
                    "compared": cells[3],
                    "max_diff": float(cells[4]),
                    "tolerance": cells[5],
                    "verdict": cells[6],
                }
            )
    return rows


#: a §16 row that runs a method's whole training loop beside the official one (issue 52)
_LOOP = ".loop"
_LOOP_SIZE = re.compile(r"over (\d+) tasks? x (\d+) steps")
_NOT_OFFICIAL = ("gr4cil", "finetune")  # the paper's method and the suite's own: no official code


def _equality_cell(name: str, rows: list[dict]) -> str:
    mine = [row for row in rows if name in row["strategies"] and not row["component"].endswith(_LOOP)]
    if not mine:
        return "no official code run (docs/baselines.md §16)" if name not in _NOT_OFFICIAL else "-"
    equal = sum(row["verdict"] == "equal" for row in mine)
    worst = max(row["max_diff"] for row in mine)
    return f"{equal} of {len(mine)} components equal, max diff {worst:.1e}"


def _loop_cell(name: str, rows: list[dict]) -> str:
    """The method's training loop beside the official one: "equal (2 tasks x 6 steps, max diff 7.6e-06)"."""
    loops = [row for row in rows if name in row["strategies"] and row["component"].endswith(_LOOP)]
    if not loops:
        return "not compared (docs/baselines.md §16)" if name not in _NOT_OFFICIAL else "-"
    cells = []
    for row in loops:
        size = _LOOP_SIZE.search(row["compared"])
        steps = f"{size[1]} task{'s' if size[1] != '1' else ''} x {size[2]} steps, " if size else ""
        cells.append(f"{row['verdict']} ({steps}max diff {row['max_diff']:.1e})")
    return "; ".join(cells)


def _avg_last(runs: list[RunResult]) -> str:
    """ "Avg / Last", each the mean over ``runs``."""
    return " / ".join(f"{fmean(r.summary[metric] for r in runs):.2f}" for metric in ("avg_acc", "last_acc"))


def _avg_last_spread(runs: list[RunResult]) -> str:
    """ "Avg / Last" as mean ± std over seeds with n, or the one seed's numbers with "n = 1". The std
    is the population std, as in ``analysis.tables``, so both files print the same cell."""
    if len(runs) == 1:
        return f"{_avg_last(runs)} (n = 1)"
    cells = []
    for metric in ("avg_acc", "last_acc"):
        values = [r.summary[metric] for r in runs]
        cells.append(mean_std_cell(fmean(values), population_std(values)))
    return f"{' / '.join(cells)} (n = {len(runs)})"


def ranking_agreement(
    last_by_row: dict[str, list[float]], paper_last: dict[str, float], draws: int = 2000, seed: int = 0
) -> tuple[float, float, float, int] | None:
    """Kendall's tau-b between the mean of each row's Last over its seeds and the paper's Last, over
    the rows both have, with a 95 % percentile bootstrap interval over seeds (each row's seeds
    resampled with replacement, ``draws`` times). Returns (tau, low, high, rows), or None with
    fewer than 3 rows. With one seed a row a draw is the point itself, so the interval is that point."""
    from scipy.stats import kendalltau

    rows = sorted(set(last_by_row) & set(paper_last))
    if len(rows) < 3:
        return None
    paper = np.array([paper_last[r] for r in rows])
    tau = float(kendalltau([fmean(last_by_row[r]) for r in rows], paper).statistic)
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(draws):
        means = [float(np.mean(rng.choice(last_by_row[r], size=len(last_by_row[r])))) for r in rows]
        samples.append(kendalltau(means, paper).statistic)
    low, high = np.nanpercentile(samples, [2.5, 97.5])
    return tau, float(low), float(high), len(rows)


def _ranking_line(results: dict[tuple[str, str], list[RunResult]], paper) -> str:
    table = paper[
        (paper["table"] == "table1_main") & (paper["group"] == "cifar100") & (paper["metric"] == "last_acc")
    ]
    paper_last = {
        name: float(table[table["row"] == row]["value"].iloc[0])
        for name, row in PAPER_METHOD_NAMES.items()
        if (table["row"] == row).any()
    }
    last_by_row = {
        name: [r.summary["last_acc"] for r in results.get((name, MINIATURE), [])] for name in paper_last
    }
    agreement = ranking_agreement({k: v for k, v in last_by_row.items() if v}, paper_last)
    if agreement is None:
        return "Ranking: fewer than three paper rows have miniature results; no Kendall's τ."
    tau, low, high, rows = agreement
    seeds = sorted({len(v) for v in last_by_row.values() if v})
    n = f"n = {seeds[0]}" if len(seeds) == 1 else f"n = {seeds[0]}-{seeds[-1]}"
    n += " seed a row" if seeds == [1] else " seeds a row"
    interval = (
        f"95 % bootstrap interval over seeds [{low:.2f}, {high:.2f}]"
        if seeds[-1] > 1
        else "no interval: one seed a row"
    )
    return (
        "Ranking: Kendall's τ between the miniature's mean Last and the paper's CIFAR-100 Last "
        "(Table 1) over "
        f"{rows} paper rows: {tau:.2f} ({interval}; {n}). Reported, never targeted: no method, "
        "weight or world is tuned to move it."
    )


def _paper_numbers(paper, label: str) -> str:
    rows = paper[(paper["table"] == "table1_main") & (paper["row"] == PAPER_METHOD_NAMES.get(label, ""))]
    if rows.empty:
        return "not in the paper"
    cells = []
    for group in (*PAPER_DATASETS, "average"):
        values = {r.metric: r.value for r in rows[rows["group"] == group].itertuples()}
        if "avg_acc" in values and "last_acc" in values:
            name = DATASET_NAMES.get(group, "Average")
            cells.append(f"{name} {values['avg_acc']:.2f} / {values['last_acc']:.2f}")
    return "; ".join(cells)


MINIATURE_SUITE = "smoke-baselines"  # the suite whose miniature results the file reports
REAL_SUITE = "main"  # the suite whose results on the paper's datasets fill its real-data cells


def reproducibility_markdown(results_dir: str | Path, loaded: Results | None = None) -> str:
    """The file's text from the results under ``results_dir`` (which may hold none); ``loaded``: what
    ``read_results`` already read from it."""
    from benchmarks.runner.suites import available_suites

    results: dict[tuple[str, str], list[RunResult]] = defaultdict(list)
    root = Path(results_dir)
    skipped_suites: list[str] = []
    not_counted: dict[str, list[tuple[str, RunResult]]] = {}
    # each read: its results, the datasets whose cells it fills (None: all) and its suite's name
    reads: list[tuple[Results, tuple[str, ...] | None, str | None]]
    if root.is_dir():
        folders = result_folders(root)
        if any(folder.name in available_suites() for folder in folders):
            # a folder of suites' folders (results/): each cell reads the suite it names, only
            sources = {
                folder: (MINIATURE,) if folder.name == MINIATURE_SUITE else tuple(PAPER_DATASETS)
                for folder in folders
                if folder.name in (MINIATURE_SUITE, REAL_SUITE)
            }
            skipped_suites = [folder.name for folder in folders if folder not in sources]
            reads = [(read_results(folder), datasets, folder.name) for folder, datasets in sources.items()]
        else:  # one suite's folder (runs/SUITE): every run of it counts
            reads = [(read_results(root if loaded is None else loaded), None, None)]
        for read, datasets, suite in reads:
            # variants have rows of their own; the paper's numbers were made in its protocol's
            # default class order, never other orders
            for file in read.where(lambda f: f.result.label == f.result.strategy and f.key.order == "").runs:
                if datasets is not None and file.result.dataset not in datasets:
                    continue
                if suite is not None and (why := _not_the_suites_run(file.result, suite)) is not None:
                    not_counted.setdefault(suite, []).append((why, file.result))
                    continue
                results[(file.result.strategy, file.result.dataset)].append(file.result)
    paper = load_paper_reference()
    lines = [
        "# Reproducibility",
        "",
        "Generated by `python -m analysis.reproducibility` (and `python -m analysis.report`) from the result "
        "JSON under `results/`; do not edit by hand. Numbers are Avg / Last accuracy (%), mean over seeds "
        "(miniature: mean ± std over seeds, and n). The "
        "miniature (`--suite smoke-baselines`: the tiny CLIP on the synthetic world, CPU) checks each method "
        "end to end and the order of the rows, not the paper's numbers.",
        "",
        "| strategy | paper row | recipe from | verified offline | equal to the official code "
        "| training loop equal (steps x tasks, max diff) | paper, Table 1 | reproduced on real data |",
        "|---|---|---|---|---|---|---|---|",
    ]
    equality = official_equality()
    paper_rows = list(dict.fromkeys(paper[paper["table"] == "table1_main"]["row"]))  # the paper's order
    order = {row: i for i, row in enumerate(paper_rows)}
    for name, card in sorted(
        cards().items(), key=lambda item: (order.get(item[1].paper_row, len(order)), item[0])
    ):
        source, tests = card.recipe, ", ".join(card.tests)
        miniature = results.get((name, MINIATURE), [])
        offline = f"tests: {tests}"
        if miniature:
            offline += f"; miniature {_avg_last_spread(miniature)}"
        real = []
        for dataset in PAPER_DATASETS:
            runs = [r for r in results.get((name, dataset), []) if r.n_tasks == 10 and not split_of(r)]
            if runs:
                real.append(
                    f"{DATASET_NAMES[dataset]} {_avg_last(runs)} "
                    f"({len(runs)} seed{'s' if len(runs) > 1 else ''})"
                )
        lines.append(
            f"| `{name}` | {row_label(name)} | {source} | {offline} | {_equality_cell(name, equality)} | "
            f"{_loop_cell(name, equality)} | {_paper_numbers(paper, name)} | "
            f"{'; '.join(real) or 'not yet run'} |"
        )
    lines += ["", _ranking_line(results, paper), ""]
    if skipped_suites:
        lines += [
            f"Not counted: the results of {', '.join(f'`{name}`' for name in skipped_suites)} under "
            f"`{root.name}/`: the miniature cells read `{MINIATURE_SUITE}`'s and the real-data cells "
            f"`{REAL_SUITE}`'s alone.",
            "",
        ]
    for suite, uncounted in not_counted.items():
        lines += [_not_counted_line(root, suite, uncounted), ""]
    stale = _stale_miniature_results(results)
    if stale:
        lines += [stale, ""]
    return "\n".join(lines)


#: the config entries that make a stored result one of its suite's runs as the suite now reads
SUITE_CONFIG_ENTRIES = ("backbone", "strategy_options", "epoch_scale")


@functools.cache
def _suite_runs(suite: str) -> dict[tuple[str, str, int, str], dict]:
    """Each run of ``suite`` as it now reads, by (strategy, dataset, tasks, split): the entries of
    its config (``SUITE_CONFIG_ENTRIES``) that a stored result of it must hold."""
    from benchmarks.backbone import recorded_backbone
    from benchmarks.runner.suites import expand, load_suite

    definition = load_suite(suite)
    return {
        (spec.strategy, spec.dataset, spec.n_tasks, spec.split): {
            "backbone": recorded_backbone(spec.backbone),
            **{key: spec.config.get(key) for key in SUITE_CONFIG_ENTRIES if key != "backbone"},
        }
        for spec in expand(definition, seeds=definition["seeds"][:1])
    }


def _not_the_suites_run(result: RunResult, suite: str) -> str | None:
    """Why a result under ``suite``'s folder is none of the suite's runs as it now reads (a run it
    does not hold; another checkpoint or recipe); None where it is one (of any seed)."""
    expected = _suite_runs(suite).get((result.strategy, result.dataset, result.n_tasks, split_of(result)))
    if expected is None:
        return "of a run the suite does not hold"
    if any(result.config.get(key) != value for key, value in expected.items()):
        return "computed with another checkpoint or recipe than the suite now gives"
    return None


def _not_counted_line(root: Path, suite: str, runs: list[tuple[str, RunResult]]) -> str:
    """The line naming the results under a suite's folder that no cell counts, and why."""
    by_why: dict[str, list[RunResult]] = defaultdict(list)
    for why, result in runs:
        by_why[why].append(result)

    def named(results: list[RunResult]) -> str:
        return ", ".join(sorted({f"`{r.strategy}` {r.dataset} T{r.n_tasks}" for r in results}))

    causes = "; ".join(f"{len(results)} {why} ({named(results)})" for why, results in sorted(by_why.items()))
    return (
        f"Not counted: {len(runs)} result(s) under `{root.name}/{suite}/` that are not `{suite}`'s runs "
        f"as it now reads: {causes}. `python -m benchmarks.run --suite {suite} --results-dir "
        f"{root.name}/{suite} --force` recomputes the suite's runs."
    )


#: changes of a method's training that its config cannot show, after which a stored result no
#: longer describes the code: strategy -> (the change's commit time, what changed)
_LATE_COSINE = "the cosine one epoch late, as the official loop (b89da8a, issue 52)"
TRAINING_CHANGES = {
    "l2p_pp": ("2026-11-27T23:19:32+00:00", _LATE_COSINE),
    "dualprompt": ("2026-11-27T23:19:32+00:00", _LATE_COSINE),
    "coda_prompt": (
        "2026-11-27T23:19:32+00:00",
        f"{_LATE_COSINE}; the first task's draws in the official order",
    ),
    "clap": (
        "2026-11-27T23:33:16+00:00",
        "training in the official batch context, eval_noise 'batch' drawn once a batch (dc5c536, issue 52)",
    ),
}


def _stale_miniature_results(results: dict[tuple[str, str], list[RunResult]]) -> str:
    """A warning when stored miniature results no longer match the shipped checkpoint, the
    ``smoke-baselines`` suite as it now reads, or their method's training (``TRAINING_CHANGES``);
    "" when all match."""
    stored = [r for (_, dataset), runs in results.items() if dataset == MINIATURE for r in runs]
    stale = [r for r in stored if _not_the_suites_run(r, MINIATURE_SUITE) is not None]
    changed = [
        r
        for r in stored
        if r not in stale
        and r.strategy in TRAINING_CHANGES
        and str(r.env.get("started_at", "")) < TRAINING_CHANGES[r.strategy][0]
    ]
    if not stale and not changed:
        return ""
    causes = []
    if stale:
        causes.append(
            f"{len(stale)} were computed with another checkpoint of the tiny CLIP or another recipe than "
            f"`smoke-baselines` now gives ({', '.join(sorted({r.strategy for r in stale}))})"
        )
    for name in sorted({r.strategy for r in changed}):
        runs = sum(r.strategy == name for r in changed)
        causes.append(f"{runs} of `{name}` predate a change of its training: {TRAINING_CHANGES[name][1]}")
    return (
        f"**Stale:** of the {len(stored)} miniature results, {'; '.join(causes)}. Their numbers describe "
        "the earlier code. `python -m benchmarks.run --suite smoke-baselines --results-dir "
        "results/smoke-baselines --force` recomputes them."
    )


def write_reproducibility(results_dir: str | Path, out: str | Path, loaded: Results | None = None) -> Path:
    out = Path(out)
    atomic_write_text(out, reproducibility_markdown(results_dir, loaded))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="python -m analysis.reproducibility", description=__doc__.split("\n")[0])
    parser.add_argument("--results-dir", default="results", help="folder of result JSON (default: results)")
    parser.add_argument(
        "--out", default="REPRODUCIBILITY.md", help="the file to write (default: REPRODUCIBILITY.md)"
    )
    args = parser.parse_args(argv)
    parser.output_file(args.out)
    try:
        results_folder(args.results_dir)
        print(f"wrote {write_reproducibility(args.results_dir, args.out)}")
    except (UserError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
