"""The shipped offline ``smoke`` suite, run exactly as the README's first command runs it."""

import pytest

from benchmarks import run
from benchmarks.results import iter_results

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke_results(tmp_path_factory):
    results = tmp_path_factory.mktemp("smoke")
    assert run.main(["--suite", "smoke", "--results-dir", str(results), "--quiet"]) == 0
    return results, {r["label"]: r for _, r in iter_results(results)}


def test_smoke_runs_every_strategy_of_the_suite(smoke_results):
    _, runs = smoke_results
    assert {"continual_clip", "finetune"} <= set(runs)
    assert all(r["n_tasks"] == 10 and len(r["stages"]) == 10 for r in runs.values())


def test_finetune_visibly_forgets_task_1(smoke_results):
    _, runs = smoke_results
    stages = runs["finetune"]["stages"]
    right_after, at_the_end = stages[0]["acc_per_task"][0], stages[-1]["acc_per_task"][0]
    assert at_the_end < right_after - 5.0, (right_after, at_the_end)


def test_rerun_skips_every_finished_run(smoke_results, capsys):
    results, runs = smoke_results
    capsys.readouterr()
    assert run.main(["--suite", "smoke", "--results-dir", str(results), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.err.count(": cached;") == len(runs)
    assert "| finetune |" in captured.out
