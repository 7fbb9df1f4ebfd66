"""The worked example of docs/adding-a-strategy.md: a strategy from outside the repository, run
beside GR4CIL on the 5-task tiny world and compared with ``analysis.compare``."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.helpers import tiny_suite

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "my_strategy"
LABEL = "my_strategy.strategy:MyStrategy"
SUITE = (
    tiny_suite(["gr4cil"], seeds=(0, 1))
    + """[dataset.synthetic]
n_train_per_class = 10
n_test_per_class = 4
[defaults]
batch_size = 32
[strategy.gr4cil]
epochs = 1
"""
)


def _python(*argv, cwd):
    env = {**os.environ, "PYTHONPATH": str(EXAMPLE), "OMP_NUM_THREADS": "1"}  # installs nothing
    return subprocess.run(
        [sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=1200
    )


@pytest.mark.slow
def test_the_example_strategy_runs_beside_gr4cil_and_compares(tmp_path):
    (tmp_path / "suite.toml").write_text(SUITE)
    results = tmp_path / "results"
    ran = _python(
        "-m",
        "benchmarks.run",
        "--suite",
        str(tmp_path / "suite.toml"),
        "--strategies",
        f"{LABEL},gr4cil",
        "--results-dir",
        str(results),
        "--quiet",
        cwd=REPO,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert f"{LABEL} on synthetic takes from the suite: batch_size = 32 ([defaults])" in ran.stderr
    last = {}
    for path in results.glob("synthetic/*/T5-seed*.json"):
        result = json.loads(path.read_text())
        assert result["schema_version"] == 5 and (path.parent / result["predictions"]["file"]).exists()
        last[(result["label"], result["seed"])] = result["summary"]["last_acc"]
    assert set(last) == {(label, seed) for label in (LABEL, "gr4cil") for seed in (0, 1)}

    compared = _python(
        "-m", "analysis.compare", "--results-dir", str(results), "--baseline", "gr4cil", cwd=tmp_path
    )
    assert compared.returncode == 0, compared.stderr
    (row,) = pd.read_csv(results / "compare" / "compare-last.csv").to_dict("records")
    assert (row["method"], row["baseline"], row["n"], row["baseline_n"], row["paired_seeds"]) == (
        LABEL,
        "gr4cil",
        2,
        2,
        "0 1",
    )
    expected = np.mean([last[(LABEL, s)] - last[("gr4cil", s)] for s in (0, 1)])
    assert row["difference"] == pytest.approx(expected)
    assert row["low"] <= row["difference"] <= row["high"] and row["detectable"] > 0
    # the synthetic world with the tiny CLIP: a difference there is worded as no ranking
    offline = "on the synthetic world with the tiny CLIP only: not a ranking"
    verdict = (
        f"better {offline}"
        if row["low"] > 0
        else f"worse {offline}"
        if row["high"] < 0
        else "no detectable difference at 95 %"
    )
    assert row["verdict"] == verdict
    assert f"| {LABEL} | synthetic | 5 |" in compared.stdout and f"{expected:+.2f}" in compared.stdout
    assert "**Not a ranking**: runs on the synthetic world with the tiny CLIP" in compared.stdout
    assert (results / "compare" / "compare-my_strategy.strategy_MyStrategy-last.png").stat().st_size > 0
