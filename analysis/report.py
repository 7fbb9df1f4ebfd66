"""Write every paper table and figure from a folder of result JSON.

``python -m analysis.report --results-dir DIR --out DIR [--no-paper] [--only NAME,...]
[--as-published DIR] [--by-suite]``.

One folder of results is one suite's (``runs/SUITE``): results of two suites for the same run are
refused, never chosen between (``benchmarks.runner.reading.read_results``), and fast-dev-run results
beside real ones are left out with a note. ``--by-suite`` reads each folder under ``--results-dir``
as a suite of its own and writes its report under ``OUT/SUITE/``.

Writes, under the output folder::

    tables/<name>.md, .csv, .tex     one per paper table (see ``analysis.paper_tables.TABLES``)
    tables/against_gr4cil-<metric>.md, .csv, .tex   every strategy against GR4CIL, paired, with
                                     intervals and verdicts (``analysis.compare``): last, avg,
                                     forgetting, bwt
    figures/against_gr4cil/          one ``analysis.compare`` figure per strategy
    tables/protocol_effect.md, .csv, .tex   with ``--as-published DIR`` (main-as-published's results):
                                     as-published minus one-protocol per row (``analysis.protocol_effect``)
    figures/<name>.png, .pdf         one per figure (see ``analysis.figures.FIGURES``)
    figures/acc_matrix/<run>.png, .pdf
    figures/fig_class_orders.png, .pdf   where some method ran several class orders: how much the
                                     order moves each method (``analysis.order_figure``)
    report.md                        all tables, links to the figures, and what was skipped
    REPRODUCIBILITY.md               one row per strategy (``analysis.reproducibility``)

The paper tables and figures read one class order a method, dataset and task count (the protocol's
default where it was run, ``analysis.paper_inputs``); the comparison against GR4CIL and
``fig_class_orders`` read every order. A table or figure whose inputs are missing is skipped with
a one-line note on stderr. By default
every table also shows the paper's numbers ("[paper]" rows) and the difference ("Δ" rows). The
LaTeX needs ``booktabs`` and ``amssymb`` (for ``\\checkmark``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from analysis import figures
from analysis.order_figure import ORDER_FIGURE, fig_class_orders, order_frame
from analysis.paper_inputs import MissingInputs, load_inputs, load_paper_reference
from analysis.paper_tables import TABLES
from benchmarks.core.atomic_io import atomic_write_text
from benchmarks.core.errors import (
    CommandParser,
    UserError,
    one_line_user_errors,
    output_folder,
    results_folder,
)
from benchmarks.runner.reading import Results, result_folders


@dataclass
class ReportItem:
    """One table or figure of the report: the files written, or why it was skipped."""

    name: str
    kind: str  # "table" | "figure"
    paths: list[Path] = field(default_factory=list)
    skipped: str = ""  # one-line reason; empty when written

    @property
    def written(self) -> bool:
        return not self.skipped

    def __str__(self) -> str:
        if self.skipped:
            return f"skipped {self.name}: {self.skipped}"
        return f"wrote {self.name}: {len(self.paths)} files ({self.paths[0].parent})"


def build_report(
    results_dir: str | Path,
    out_dir: str | Path,
    with_paper: bool = True,
    log: Callable[[str], None] | None = None,
    only: Iterable[str] | None = None,
    as_published_dir: str | Path | None = None,
) -> list[ReportItem]:
    """Write every table and figure that the results allow; return one item per table/figure
    (tables first, in paper order). Raises ``UserError`` only when there are no results at all.

    ``log`` receives one line per note about the inputs (e.g. runs that share a key); ``only``
    restricts the report to the named tables and figures; ``as_published_dir`` adds the table of how
    much the protocol moves each row (``results_dir`` then holds the one-protocol runs).
    """
    names = [*TABLES, AGAINST_GR4CIL, *figures.FIGURES, ORDER_FIGURE]
    wanted = set(only) if only is not None else set(names)
    unknown = wanted - set(names)
    if unknown:
        raise UserError(f"unknown table or figure {sorted(unknown)}; choose from {', '.join(names)}")
    inputs = load_inputs(results_dir)
    if log is not None:
        for note in inputs.notes:
            log(f"note: {note}")
    out_dir = Path(out_dir)
    paper = load_paper_reference() if with_paper else None
    items: list[ReportItem] = []
    markdown = []
    for name, builder in TABLES.items():
        if name not in wanted:
            continue
        try:
            rendered = builder(inputs).render(paper)
        except MissingInputs as reason:
            items.append(ReportItem(name, "table", skipped=str(reason)))
            continue
        paths = [out_dir / "tables" / f"{name}.{ext}" for ext in ("md", "csv", "tex")]
        texts = [rendered.to_markdown(), rendered.to_csv(), rendered.to_latex()]
        for path, text in zip(paths, texts):
            atomic_write_text(path, text)
        markdown.append(texts[0])
        items.append(ReportItem(name, "table", paths))
    if AGAINST_GR4CIL in wanted:
        item, texts = _against_gr4cil(results_dir, inputs.loaded, out_dir)
        items.append(item)
        markdown += texts
    if as_published_dir is not None:
        from analysis.protocol_effect import TABLE, protocol_effect, write_protocol_effect

        try:
            frame, notes = protocol_effect(results_dir, as_published_dir)
            paths = write_protocol_effect(frame, out_dir / "tables", notes)
            markdown.append(paths[0].read_text())
            items.append(ReportItem(TABLE, "table", paths))
        except UserError as reason:
            items.append(ReportItem(TABLE, "table", skipped=str(reason)))
    for name, draw in figures.FIGURES.items():
        if name not in wanted:
            continue
        try:
            items.append(ReportItem(name, "figure", draw(inputs, out_dir / "figures")))
        except MissingInputs as reason:
            items.append(ReportItem(name, "figure", skipped=str(reason)))
    if ORDER_FIGURE in wanted and not order_frame(inputs.every_order).empty:  # only where orders vary
        items.append(ReportItem(ORDER_FIGURE, "figure", fig_class_orders(inputs, out_dir / "figures")))
    atomic_write_text(out_dir / "report.md", _index(items, markdown, inputs.notes, out_dir, inputs.caveat))
    from analysis.reproducibility import write_reproducibility

    items.append(
        ReportItem(
            "reproducibility",
            "table",
            [write_reproducibility(results_dir, out_dir / "REPRODUCIBILITY.md", inputs.loaded)],
        )
    )
    return items


AGAINST_GR4CIL = "against_gr4cil"


def _against_gr4cil(
    results_dir: str | Path, loaded: Results | None, out_dir: Path
) -> tuple[ReportItem, list[str]]:
    """Every strategy against GR4CIL (``analysis.compare``), for Last and Avg accuracy, forgetting
    and backward transfer."""
    from analysis import paired_runs, pairing
    from analysis.comparison_output import render_markdown, write_comparison

    paths: list[Path] = []
    texts: list[str] = []
    read_problems: list[str] = []
    # the results the tables read, for every metric
    runs = paired_runs.load_runs(results_dir if loaded is None else loaded, read_problems)
    for metric in pairing.METRICS:
        problems = list(read_problems)  # each table's own notes: none repeated from another metric's
        try:
            comparisons = pairing.compare_all(
                results_dir, "gr4cil", metric=metric, problems=problems, runs=runs
            )
        except UserError as reason:  # no GR4CIL run, nothing to pair, or another protocol
            if metric in pairing.TASK_METRICS and paths:  # only one-task runs: accuracy still compared
                problems.append(f"{pairing.METRICS[metric][1]} against GR4CIL left out: {reason}")
                continue
            return ReportItem(AGAINST_GR4CIL, "table", skipped=str(reason)), []
        paths += write_comparison(
            comparisons,
            out_dir / "figures" / AGAINST_GR4CIL,
            problems,
            table_dir=out_dir / "tables",
            stem=AGAINST_GR4CIL,
        )
        texts.append(render_markdown(comparisons, problems))
    return ReportItem(AGAINST_GR4CIL, "table", paths), texts


def _index(
    items: list[ReportItem], tables_markdown: list[str], notes: list[str], out_dir: Path, caveat: str | None
) -> str:
    lines = [
        "# Reproduced tables and figures",
        "",
        *([f"**{caveat}** (Notes, below).", ""] if caveat else []),
        "Generated by `python -m analysis.report`. Cells: mean ± std over seeds; `[paper]` rows are "
        "the paper's published numbers, `Δ` rows reproduced minus paper.",
        "",
    ]
    for table in tables_markdown:
        lines += [table, ""]
    lines.append("## Figures")
    lines.append("")
    for item in items:
        if item.kind == "figure" and item.written:
            pngs = [p for p in item.paths if p.suffix == ".png"]
            lines += (
                [f"![{item.name}]({pngs[0].relative_to(out_dir).as_posix()})", ""]
                if len(pngs) == 1
                else [
                    f"- {item.name}: {len(pngs)} images in "
                    f"`{pngs[0].parent.relative_to(out_dir).as_posix()}/`",
                    "",
                ]
            )
    skipped = [str(item) for item in items if not item.written] + notes
    if skipped:
        lines += ["## Notes", "", *(f"- {line}" for line in skipped), ""]
    return "\n".join(lines)


@one_line_user_errors
def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="python -m analysis.report", description=__doc__.split("\n")[0])
    parser.add_argument("--results-dir", required=True, help="folder of result JSON (searched recursively)")
    parser.add_argument("--out", required=True, help="folder for tables/, figures/ and report.md")
    parser.add_argument(
        "--no-paper", action="store_true", help="leave out the paper's numbers and differences"
    )
    parser.add_argument("--only", help="comma-separated names of the tables/figures to make (default: all)")
    parser.add_argument(
        "--as-published",
        metavar="DIR",
        help="main-as-published's results: adds the table of how much the protocol moves each row",
    )
    parser.add_argument(
        "--by-suite",
        action="store_true",
        help="one report per suite: each folder directly under --results-dir that holds results "
        "(runs/SUITE, results/SUITE) gets its own, under OUT/SUITE/",
    )
    args = parser.parse_args(argv)
    out = output_folder(args.out, "--out")  # before any table is built, not after
    if args.by_suite and args.as_published:
        raise UserError(
            "--as-published compares two folders; give it one suite's --results-dir, not --by-suite"
        )
    if args.by_suite:
        jobs = [(folder, out / folder.name) for folder in suite_folders(args.results_dir)]
    else:
        jobs = [(Path(args.results_dir), out)]
    for results_dir, report_dir in jobs:
        if args.by_suite:
            print(f"suite {results_dir.name}: {results_dir}", file=sys.stderr)
        items = build_report(
            results_dir,
            report_dir,
            with_paper=not args.no_paper,
            log=lambda line: print(line, file=sys.stderr),
            only=args.only.split(",") if args.only else None,
            as_published_dir=args.as_published,
        )
        for item in items:
            print(item, file=sys.stdout if item.written else sys.stderr)
        print(f"report: {report_dir / 'report.md'}")
    return 0


def suite_folders(results_dir: str | Path) -> list[Path]:
    """The folders directly under ``results_dir`` that hold results, one per suite by the runner's
    layout (``runs/SUITE``); a fast dev run's folder (``SUITE-fast-dev-run``) is one of its own."""
    root = results_folder(results_dir, fix="give the folder that holds runs/SUITE folders")
    found = result_folders(root)
    if not found:
        raise UserError(f"no folder under {root} holds results; --by-suite reads {root}/SUITE/ folders")
    return found


if __name__ == "__main__":
    sys.exit(main())
