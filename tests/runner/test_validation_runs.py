"""Runs with a validation split: held out of the training images, scored at every stage by the
test's own metrics and stored beside them; recorded in the config (and hash) only when set; and a
tuning run (``evaluate_test = false``) that never reads a test image."""

from __future__ import annotations

import dataclasses

import pytest
from torch.utils.data import Dataset

from benchmarks import run
from benchmarks.core.metrics import summarize
from benchmarks.runner import building
from benchmarks.runner.reading import not_a_measurement
from benchmarks.runner.result_record import RunResult
from tests.helpers import run_one_run_suite, tiny_suite

N_CLASSES, TRAIN, TEST = 15, 8, 4
DATA = f"""[dataset.synthetic]
n_classes = {N_CLASSES}
n_train_per_class = {TRAIN}
n_test_per_class = {TEST}
[defaults]
batch_size = 16
"""


def _root(path):
    path.mkdir(parents=True, exist_ok=True)
    return path


def _suite(validation: str = "") -> str:
    return validation + tiny_suite(["continual_clip"], tasks=3) + DATA


def test_validation_metrics_are_stored_beside_the_test_ones_at_every_stage(tmp_path):
    _, _, plain = run_one_run_suite(_root(tmp_path / "plain"), _suite())
    assert "validation" not in plain["config"] and "validation_summary" not in plain
    assert all("validation" not in stage for stage in plain["stages"])

    _, _, result = run_one_run_suite(_root(tmp_path / "held"), _suite("validation_fraction = 0.25\n"))
    assert result["config"]["validation"] == {"fraction": 0.25, "seed": 0}
    assert result["config_hash"] != plain["config_hash"]
    for stage in result["stages"]:  # round(0.25 * 8) = 2 images of each of a task's 5 classes
        assert stage["validation"]["n_test_per_task"] == [N_CLASSES // 3 * 2] * stage["task"]
        assert stage["n_test_per_task"] == [N_CLASSES // 3 * TEST] * stage["task"]
        assert set(stage["validation"]) == {
            k for k in stage if k not in ("task", "diagnostics", "validation")
        }
    assert result["validation_summary"] == summarize([s["validation"] for s in result["stages"]])


def test_training_never_sees_the_held_out_images(tmp_path):
    from benchmarks.runner.suites import expand, load_suite

    path = tmp_path / "suite.toml"
    path.write_text(_suite("validation_fraction = 0.25\nvalidation_seed = 3\n"))
    (spec,) = expand(load_suite(str(path)))
    built = building.build_run(building.resolve(spec, str(tmp_path)), str(tmp_path))
    trained = sum(len(experience.dataset) for experience in built.stream.train_stream)
    assert trained == N_CLASSES * (TRAIN - 2)
    assert len(built.stream.validation_targets) == N_CLASSES * 2
    assert sorted(set(built.stream.validation_targets)) == list(range(N_CLASSES))


class _NoTestImage(Dataset):
    def __len__(self):
        return N_CLASSES * TEST

    def __getitem__(self, index):
        raise AssertionError("a tuning run read a test image")


def test_a_tuning_run_never_reads_a_test_image(tmp_path, monkeypatch):
    real = building.load_run_data

    def without_test_images(spec, data_root):
        return dataclasses.replace(real(spec, data_root), test=_NoTestImage())

    monkeypatch.setattr(building, "load_run_data", without_test_images)
    suite = _suite("validation_fraction = 0.25\nevaluate_test = false\n")
    _, _, result = run_one_run_suite(tmp_path, suite)
    assert result["config"]["evaluate_test"] is False
    # tables, the report and the comparison flag it: its "test" numbers are validation ones
    assert not_a_measurement(RunResult.from_json(result)) == "a tuning run scored on its validation split"
    for stage in result["stages"]:  # the validation set is scored in the test's place
        assert stage["n_test_per_task"] == stage["validation"]["n_test_per_task"] == [10] * stage["task"]
    with pytest.raises(AssertionError, match="read a test image"):  # the guard itself bites
        run_one_run_suite(_root(tmp_path / "tested"), _suite("validation_fraction = 0.25\n"))


@pytest.mark.parametrize(
    "line, says",
    [
        ("validation_fraction = 0.6", "validation_fraction must be a number in (0, 0.5]"),
        ("validation_fraction = 0", "validation_fraction must be a number in (0, 0.5]"),
        ("validation_fraction = true", "validation_fraction must be a number in (0, 0.5]"),
        ("validation_seed = 1", "validation_seed needs a validation split"),
        ("evaluate_test = false", "evaluate_test = false needs a validation split"),
        ("validation_fraction = 0.1\nvalidation_seed = -1", "validation_seed must be a whole number >= 0"),
    ],
)
def test_a_bad_validation_setting_is_one_line(tmp_path, capsys, line, says):
    suite = tmp_path / "suite.toml"
    suite.write_text(_suite(line + "\n"))
    assert run.main(["--suite", str(suite), "--results-dir", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("evaluate_test", [True, False])
def test_a_fast_dev_run_limits_the_validation_split_as_it_limits_the_test_set(tmp_path, evaluate_test):
    from benchmarks.runner.limits import RunLimits
    from benchmarks.runner.suites import expand, load_suite

    path = tmp_path / "suite.toml"
    path.write_text(_suite(f"validation_fraction = 0.25\nevaluate_test = {str(evaluate_test).lower()}\n"))
    (spec,) = expand(load_suite(str(path)), limits=RunLimits.fast_dev_run())
    stream = building.build_run(building.resolve(spec, str(tmp_path)), str(tmp_path)).stream
    assert sum(len(experience.dataset) for experience in stream.train_stream) == N_CLASSES  # one a class
    assert len(stream.validation_targets) == len(stream.test_targets) == 3  # one a task
    assert {stream.task_of_class[c] for c in stream.validation_targets} == {0, 1, 2}
    assert (stream.validation_set is stream.test_set) is not evaluate_test
