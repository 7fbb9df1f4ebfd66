"""Every registered strategy runs a half-base stream end to end: a fast dev run of smoke-baselines
(the synthetic 100-class world, the offline tiny CLIP) as B50-Inc25, a first task of 50 classes then
two of 25, each result storing the split, its real task count and sizes, under its own file name."""

import pytest

from benchmarks import run
from benchmarks.data.class_orders import resolve_class_order
from benchmarks.runner.reading import iter_results
from strategies.registry import available


@pytest.mark.slow
def test_every_strategy_learns_a_half_base_stream(tmp_path):
    results_dir = tmp_path / "results"
    command = ["--suite", "smoke-baselines", "--tasks", "B50-Inc25", "--seeds", "0", "--fast-dev-run"]
    assert run.main([*command, "--workers", "1", "--quiet", "--results-dir", str(results_dir)]) == 0
    results = {r["label"]: (path, r) for path, r in iter_results(results_dir)}
    assert sorted(results) == sorted(available())  # the 12 registered strategies
    order = resolve_class_order("seed1993", 100, "synthetic")
    for label, (path, result) in results.items():
        assert path.name == "B50-Inc25-T3-seed0.json", label
        assert result["n_tasks"] == 3 and result["config"]["split"] == "B50-Inc25", label
        assert result["tasks"] == [order[:50], order[50:75], order[75:]], label
        # one stage a task; one test image a task, each learned task scored at each stage
        assert [s["n_test_per_task"] for s in result["stages"]] == [[1], [1, 1], [1, 1, 1]], label
        assert [s["task"] for s in result["stages"]] == [1, 2, 3], label
