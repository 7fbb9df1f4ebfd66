"""The smoke-baselines numbers quoted in the README and docs/miniature.md are the stored results'."""

import re
from pathlib import Path

import pytest

from analysis.formatting import mean_std_cell
from analysis.tables import aggregate, load_runs

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def last_cells() -> dict[str, str]:
    stats = aggregate(load_runs(ROOT / "results" / "smoke-baselines"))
    return {
        label: mean_std_cell(
            row[("last_acc", "mean")], row[("last_acc", "std")], n=row[("last_acc", "count")]
        )
        for (label, _, _), row in stats.iterrows()
    }


def test_every_strategy_has_three_stored_seeds(last_cells):
    from strategies.registry import available

    stats = aggregate(load_runs(ROOT / "results" / "smoke-baselines"))
    assert sorted(last_cells) == sorted(available())
    assert set(stats[("last_acc", "count")]) == {3}


def test_the_miniature_table_quotes_the_stored_results(last_cells):
    text = (ROOT / "docs" / "miniature.md").read_text()
    section = text[text.index("## What `smoke-baselines` gives") :]
    for label, cell in last_cells.items():
        assert re.search(rf"^\| {label} \| {re.escape(cell)} \|", section, re.M), (label, cell)


def test_the_readme_quotes_the_stored_results_and_tau(last_cells):
    readme = (ROOT / "README.md").read_text()
    for cell in last_cells.values():
        assert cell in readme, cell
    tau = re.search(
        r"over 11 paper rows: ([0-9.]+) \(95 % bootstrap interval over seeds \[([0-9.]+), ([0-9.]+)\]",
        (ROOT / "REPRODUCIBILITY.md").read_text(),
    )
    assert tau, "REPRODUCIBILITY.md has no tau line"
    assert f"{tau[1]} (95 % interval over seeds [{tau[2]}, {tau[3]}])" in readme
