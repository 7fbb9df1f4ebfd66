"""The smoke-baselines numbers quoted in the README and docs/miniature.md are the stored results'."""

import re
from pathlib import Path

import pytest

from analysis.tables import accuracy_table, load_runs

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def runs():
    return load_runs(ROOT / "results" / "smoke-baselines")


@pytest.fixture(scope="module")
def last_cells(runs) -> dict[str, str]:
    """Each strategy's Last cell as analysis.tables prints it (mean ± population std)."""
    return accuracy_table(runs)[("synthetic", "Last")].to_dict()


def test_every_strategy_has_three_stored_seeds(runs):
    from strategies.registry import available

    seeds = runs.groupby("label")["seed"].nunique()
    assert sorted(seeds.index) == sorted(available())
    assert set(seeds) == {3}


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
