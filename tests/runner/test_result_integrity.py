"""Nothing silently wrong, nothing silently lost (issue 50): a strategy's scores are checked against
the contract before any metric, and a finished result is never replaced without a line saying so.

The outside strategies below are named ``tests.runner.test_result_integrity:Class``, as a user's
own strategy is: zero-shot CLIP whose scores go wrong from task 2 on."""

import json

import pytest
import torch

from benchmarks import run
from benchmarks.runner import status
from benchmarks.runner.reading import iter_results
from benchmarks.runner.result_record import SCHEMA_VERSION, result_digest
from benchmarks.runner.results import ResultStore, RunKey
from strategies.methods.continual_clip import ContinualCLIP
from tests.helpers import three_task_suite

MODULE = __name__


class _FromTask2(ContinualCLIP):
    """Zero-shot CLIP whose scores ``spoil`` makes wrong once a second task is seen (10 classes)."""

    def spoil(self, scores: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def evaluate_dataset(self, dataset, cache_key=None):
        scores = super().evaluate_dataset(dataset, cache_key=cache_key)
        return self.spoil(scores) if len(self.seen_classes) > 5 else scores


class FewColumns(_FromTask2):
    def spoil(self, scores):
        return scores[:, :3]


class ManyColumns(_FromTask2):
    def spoil(self, scores):
        return torch.cat([scores, torch.zeros(len(scores), 5)], dim=1)


class FewRows(_FromTask2):
    def spoil(self, scores):
        return scores[:-1]


class NaNScores(_FromTask2):
    def spoil(self, scores):
        scores = scores.clone()
        scores[7, 2] = float("nan")
        return scores


class ManyColumnsPerBatch(ContinualCLIP):
    """The contract's own path: no ``evaluate_dataset``, ``scores`` batch by batch, 5 columns too many."""

    evaluate_dataset = None
    finishes_pending_images = False  # finished image tensors, as the contract gives any strategy

    def scores(self, images):
        scores = super().scores(images)
        return torch.cat([scores, torch.zeros(len(scores), 5)], dim=1)


def _suite(tmp_path, strategy: str, options: str = "eval_batch_size = 100") -> str:
    path = tmp_path / "suite.toml"
    path.write_text(three_task_suite(strategy, options))
    return str(path)


def _run(
    tmp_path, strategy: str, *extra: str, results: str = "results", options: str = "eval_batch_size = 100"
):
    argv = ["--suite", _suite(tmp_path, strategy, options), "--results-dir", str(tmp_path / results)]
    return run.main([*argv, "--quiet", *extra])


def _one_error_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(("error", "Traceback"))]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, expected",
    [
        (
            "FewColumns",
            "FewColumns.evaluate_dataset gave scores of shape [60, 3] for 60 test images and 10 seen",
        ),
        ("ManyColumns", "ManyColumns.evaluate_dataset gave scores of shape [60, 15] for 60 test images"),
        ("FewRows", "FewRows.evaluate_dataset gave scores of shape [59, 10] for 60 test images"),
        ("NaNScores", "NaNScores.evaluate_dataset gave NaN at test image 7, column 2"),
        (
            "ManyColumnsPerBatch",
            "ManyColumnsPerBatch.scores gave scores of shape [60, 10] for 60 test images and 5",
        ),
    ],
)
def test_scores_off_the_contract_are_one_line_naming_strategy_stage_and_shape(
    tmp_path, capsys, name, expected
):
    strategy = f"{MODULE}:{name}"
    assert _run(tmp_path, strategy) == 2
    line = _one_error_line(capsys)
    task = 1 if name == "ManyColumnsPerBatch" else 2
    assert f"error: {strategy} / synthetic / 3 tasks / seed 0: task {task}: {expected}" in line
    assert "no result is stored" in line
    assert not list((tmp_path / "results").rglob("T3-seed0.json"))  # nothing tabled, nothing stored
    assert not list((tmp_path / "results").rglob("*.predictions.safetensors"))


SUITE = "tests.runner.test_result_integrity:ZeroShot"  # an outside strategy that keeps the contract


class ZeroShot(ContinualCLIP):
    pass


@pytest.fixture
def finished(tmp_path, capsys):
    """One finished run of the outside ``ZeroShot``: its results folder and result path."""
    assert _run(tmp_path, SUITE) == 0
    (path,) = (tmp_path / "results").rglob("T3-seed0.json")
    capsys.readouterr()
    return tmp_path / "results", path


@pytest.mark.slow
def test_a_result_carries_the_digest_of_its_stages_and_summary(finished):
    _, path = finished
    result = json.loads(path.read_text())
    assert result["schema_version"] == SCHEMA_VERSION == 5
    assert result["digest"] == result_digest(result["stages"], result["summary"])


@pytest.mark.slow
def test_a_newer_schema_is_refused_and_named_by_the_run_the_dry_run_and_status(tmp_path, capsys, finished):
    results, path = finished
    future = {**json.loads(path.read_text()), "schema_version": SCHEMA_VERSION + 1}
    path.write_text(json.dumps(future))
    for extra in ((), ("--force",)):  # never recomputed, not even when forced
        assert _run(tmp_path, SUITE, *extra) == 2
        line = _one_error_line(capsys)
        assert f"result file {path}: schema_version {SCHEMA_VERSION + 1}, newer than the versions" in line
    assert json.loads(path.read_text()) == future  # left as it was
    assert _run(tmp_path, SUITE, "--dry-run") == 0
    assert f"| refused (result file {path}: schema_version {SCHEMA_VERSION + 1}" in capsys.readouterr().out
    assert status.main(["--results-dir", str(results)]) == 0
    out = capsys.readouterr().out
    assert "| refused | result file" in out and str(path) in out


@pytest.mark.slow
def test_a_changed_config_is_refused_unless_forced_and_says_what_changed(tmp_path, capsys, finished):
    _, path = finished
    before = path.read_text()
    assert _run(tmp_path, SUITE, options="eval_batch_size = 50") == 2
    line = _one_error_line(capsys)
    assert f"result file {path} was computed with another config" in line
    assert "; changed: strategy_config.eval_batch_size, strategy_options.eval_batch_size)" in line
    assert "rerun with --force to replace it" in line
    assert path.read_text() == before
    assert _run(tmp_path, SUITE, "--force", options="eval_batch_size = 50") == 0
    assert json.loads(path.read_text())["config"]["strategy_config"]["eval_batch_size"] == 50


@pytest.mark.slow
def test_two_labels_of_one_folder_across_two_commands_are_refused(tmp_path, capsys, finished):
    """``module:Class`` ran first; a variant labelled ``module_Class`` would land in its folder."""
    _, path = finished
    before = path.read_text()
    variant = SUITE.replace(":", "_")
    text = three_task_suite(variant, "eval_batch_size = 100")
    text = text.replace(f'[strategy."{variant}"]', f'[variants."{variant}"]\nstrategy = "{SUITE}"')
    suite = tmp_path / "variant.toml"
    suite.write_text(text)
    for extra in ((), ("--force",)):
        assert (
            run.main(["--suite", str(suite), "--results-dir", str(tmp_path / "results"), "--quiet", *extra])
            == 2
        )
        line = _one_error_line(capsys)
        assert f"result file {path} holds the run {SUITE!r}" in line and f"the run {variant!r} shares" in line
    assert path.read_text() == before


@pytest.mark.slow
def test_a_hand_edited_summary_is_named_and_not_tabled(tmp_path, capsys, finished):
    from analysis.tables import main as tables_main
    from benchmarks.runner.reading import read_results

    results, path = finished
    result = json.loads(path.read_text())
    last = result["stages"][-1]["acc"]
    path.write_text(json.dumps({**result, "summary": {**result["summary"], "last_acc": 99.0}}))
    loaded = read_results(results)
    assert not loaded.runs
    (line,) = loaded.skipped
    assert line.startswith(
        f"skipped {path}: its summary's last_acc 99.0 disagrees with its stages ({last!r})"
    )
    assert tables_main(["--results-dir", str(results)]) == 2  # no table of nothing
    err = capsys.readouterr().err
    assert f"skipped {path}: its summary's last_acc 99.0" in err and "99.0 |" not in err
    assert _run(tmp_path, SUITE) == 2  # the runner neither trusts nor silently replaces it
    assert "disagrees with its stages" in _one_error_line(capsys)
    assert _run(tmp_path, SUITE, "--force") == 0
    assert [r["summary"]["last_acc"] for _, r in iter_results(results)] == [last]


@pytest.mark.slow
@pytest.mark.parametrize("content", ["[]", '"a result"', '{"schema_version": 4}'])
def test_a_json_that_is_no_result_at_a_results_path_is_one_line_everywhere(tmp_path, capsys, content):
    from analysis.report import main as report_main
    from analysis.tables import main as tables_main

    store = ResultStore(tmp_path / "results")
    path = store.result_path(RunKey(SUITE, "synthetic", 3, 0))
    path.parent.mkdir(parents=True)
    path.write_text(content)
    assert _run(tmp_path, SUITE) == 2
    assert f"error: result file {path}: not a result" in _one_error_line(capsys)
    assert _run(tmp_path, SUITE, "--dry-run") == 0
    assert f"| refused (result file {path}: not a result" in capsys.readouterr().out
    assert status.main(["--results-dir", str(store.root)]) == 0
    assert f"result file {path}: not a result" in capsys.readouterr().out
    assert tables_main(["--results-dir", str(store.root)]) == 2
    assert f"skipped {path}: not a result" in capsys.readouterr().err
    assert report_main(["--results-dir", str(store.root), "--out", str(tmp_path / "report")]) == 2
    assert f"skipped {path}: not a result" in capsys.readouterr().err
    with pytest.warns(UserWarning, match="not a result"):
        assert list(iter_results(store.root)) == []
    assert _run(tmp_path, SUITE, "--force") == 0  # not a result: --force may replace it
    assert [r["label"] for _, r in iter_results(store.root)] == [SUITE]


class _Absent:
    """A member a class does not have (``hasattr`` is False), though its base has it."""

    def __get__(self, instance, owner=None):
        raise AttributeError("save_model")


class CannotSave(ContinualCLIP):
    """An outside strategy with no ``save_model`` (as an adapter of another framework's has none)."""

    save_model = _Absent()


@pytest.mark.slow
def test_save_models_is_refused_before_any_run_computes(tmp_path, capsys):
    """The second run cannot save its model: the first, which could, is not computed either."""
    cannot = f"{MODULE}:CannotSave"
    text = three_task_suite("continual_clip", "eval_batch_size = 100")
    suite = tmp_path / "suite.toml"
    suite.write_text(
        text.replace('strategies = ["continual_clip"]', f'strategies = ["continual_clip", "{cannot}"]')
    )
    argv = ["--suite", str(suite), "--results-dir", str(tmp_path / "results"), "--quiet", "--save-models"]
    assert run.main(argv) == 2
    assert f"error: {cannot} has no save_model, so --save-models cannot keep its model" in _one_error_line(
        capsys
    )
    assert not list(tmp_path.rglob("T3-seed0*"))  # no run computed, no model saved
