"""The per-image predictions stored beside every result (schema version 2 on), and results of older
versions read as they are."""

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.runner.reading import ResultFile, iter_results
from benchmarks.runner.result_record import RunResult
from benchmarks.runner.results import (
    PREDICTIONS_SUFFIX,
    Predictions,
    ResultStore,
    RunKey,
    predictions_path,
    save_predictions,
)
from tests.helpers import killed_and_resumed, run_one_run_suite, tiny_suite

FINETUNE_5_TASKS = (
    tiny_suite(["finetune"])
    + """[dataset.synthetic]
n_train_per_class = 6
n_test_per_class = 3
[defaults]
batch_size = 32
lora_rank = 4
lora_alpha = 4.0
[strategy.finetune]
epochs = 1
"""
)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = tmp_path_factory.mktemp("sidecar")
    suite, results, result = run_one_run_suite(root, FINETUNE_5_TASKS)
    (path,) = [p for p, _ in iter_results(results)]
    return suite, path, result


def _sidecar(path, result: dict, problems: list[str] | None = None):
    """The predictions sidecar of the result JSON ``result`` read from ``path``."""
    return ResultFile(path, RunResult.from_json(result)).load_predictions(problems)


def _stage_accuracy(pred: np.ndarray, targets: np.ndarray, seen: set[int]) -> float:
    mask = np.isin(targets, list(seen))
    return 100.0 * float(np.mean(pred[mask] == targets[mask]))


@pytest.mark.slow
def test_the_sidecar_reproduces_every_stage_accuracy(finished):
    _, path, result = finished
    assert result["schema_version"] == 5  # 3 added forgetting and bwt, 4 the digest, 5 resumed_from
    if Path("/proc/self/clear_refs").exists():  # Linux: the run's own peak, not the test process's
        assert result["cost"]["peak_memory_kind"] == "cpu_run_peak_rss"
    entry = result["predictions"]
    assert entry["file"] == path.name.replace(".json", PREDICTIONS_SUFFIX)
    assert (entry["n_stages"], entry["n_images"], entry["dtype"]) == (5, 300, "uint16")
    predictions = _sidecar(path, result, problems := [])
    assert problems == []
    assert predictions.predictions.shape == (5, 300)
    np.testing.assert_array_equal(predictions.image_ids, np.arange(300))
    assert sorted(np.bincount(predictions.targets)) == [3] * 100  # every class's 3 test images
    seen: set[int] = set()
    for stage, classes in zip(result["stages"], result["tasks"]):
        seen |= set(classes)
        pred = predictions.predictions[stage["task"] - 1]
        assert set(np.unique(pred)) <= seen  # a prediction is always a seen class
        assert _stage_accuracy(pred, predictions.targets, seen) == pytest.approx(stage["acc"], abs=1e-9)
        for task, task_acc in enumerate(stage["acc_per_task"]):
            assert _stage_accuracy(pred, predictions.targets, set(result["tasks"][task])) == pytest.approx(
                task_acc
            )


@pytest.mark.slow
def test_a_resumed_run_stores_the_same_predictions(finished, tmp_path, monkeypatch):
    from strategies.methods.finetune import Finetune

    suite, path, result = finished
    resumed = killed_and_resumed(monkeypatch, Finetune, suite, tmp_path / "resumed", task=3)
    (resumed_path,) = [p for p, _ in iter_results(tmp_path / "resumed")]
    np.testing.assert_array_equal(
        _sidecar(resumed_path, resumed).predictions, _sidecar(path, result).predictions
    )
    assert resumed["predictions"]["sha256"] == result["predictions"]["sha256"]


def _copy(finished, tmp_path):
    _, path, result = finished
    target = tmp_path.joinpath(*path.parts[-3:])  # <dataset>/<label>/<stem>.json: its place, as readers check
    target.parent.mkdir(parents=True)
    target.write_text(path.read_text())
    predictions_path(target).write_bytes(predictions_path(path).read_bytes())
    return target, json.loads(target.read_text())


@pytest.mark.slow
def test_a_missing_sidecar_is_one_line_and_the_means_stay(finished, tmp_path):
    path, result = _copy(finished, tmp_path)
    predictions_path(path).unlink()
    with pytest.warns(UserWarning, match="predictions sidecar missing; the run's means are used") as caught:
        assert _sidecar(path, result) is None
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    assert [r["summary"] for _, r in iter_results(tmp_path)] == [result["summary"]]


@pytest.mark.slow
def test_a_damaged_sidecar_is_caught_by_its_digest(finished, tmp_path):
    path, result = _copy(finished, tmp_path)
    blob = bytearray(predictions_path(path).read_bytes())
    blob[-1] ^= 0xFF  # one flipped byte in the predictions
    predictions_path(path).write_bytes(bytes(blob))
    assert _sidecar(path, result, problems := []) is None
    assert len(problems) == 1 and "damaged" in problems[0]


@pytest.mark.slow
def test_a_version_1_result_loads_without_predictions_and_without_a_word(finished, tmp_path):
    path, result = _copy(finished, tmp_path)
    old = {k: v for k, v in result.items() if k != "predictions"} | {"schema_version": 1}
    path.write_text(json.dumps(old))
    assert _sidecar(path, old, problems := []) is None and problems == []
    assert [r["schema_version"] for _, r in iter_results(tmp_path)] == [1]
    store = ResultStore(tmp_path)
    key = RunKey(result["label"], result["dataset"], result["n_tasks"], result["seed"])
    assert store.result_path(key) == path
    store.result_path(key).write_text(json.dumps(old))
    assert store.finished(key, old["config_hash"]).to_json() == old  # never recomputed for want of a sidecar


@pytest.mark.slow
def test_a_version_2_result_is_still_finished_and_read_with_forgetting_computed(finished, tmp_path):
    from analysis.tables import load_runs
    from benchmarks import run

    suite, path, result = finished
    assert set(result["summary"]) >= {"forgetting", "bwt"}  # version 3 stores them
    key = RunKey(result["label"], result["dataset"], result["n_tasks"], result["seed"])
    store = ResultStore(tmp_path)
    store.result_path(key).parent.mkdir(parents=True)
    old_summary = {k: v for k, v in result["summary"].items() if k not in ("forgetting", "bwt")}
    old = result | {"schema_version": 2, "summary": old_summary}
    store.result_path(key).write_text(json.dumps(old))
    predictions_path(store.result_path(key)).write_bytes(predictions_path(path).read_bytes())
    # read with both computed from its stages, equal to what the runner stored
    assert store.finished(key, old["config_hash"]).summary == result["summary"]
    ((_, read),) = iter_results(tmp_path)
    assert read["summary"] == result["summary"] and read["stages"] == result["stages"]
    assert load_runs(tmp_path).loc[0, "forgetting"] == result["summary"]["forgetting"]
    # a rerun finds it finished: never recomputed for want of the new entries
    assert run.main(["--suite", str(suite), "--results-dir", str(tmp_path), "--quiet"]) == 0
    assert json.loads(store.result_path(key).read_text()) == old


def test_the_sidecar_is_compact_and_widens_only_when_class_ids_need_it(tmp_path):
    stages, images = 10, 50_000  # ImageNet-1K's validation split, 10 stages
    rng = np.random.default_rng(0)
    narrow = Predictions(
        rng.integers(0, 1000, (stages, images)), rng.integers(0, 1000, images), np.arange(images)
    )
    entry = save_predictions(tmp_path / "a" / "imagenet.predictions.safetensors", narrow)
    size = (tmp_path / "a" / "imagenet.predictions.safetensors").stat().st_size
    assert entry["dtype"] == "uint16" and size < (stages + 1) * images * 2 + images * 4 + 1024  # about 1.3 MB
    wide = Predictions(np.full((1, 3), 70_000), np.array([0, 1, 70_000]), np.arange(3))
    assert save_predictions(tmp_path / "b.predictions.safetensors", wide)["dtype"] == "uint32"
    assert list(tmp_path.glob("**/*.tmp")) == []  # written by rename: no temporary file left


def test_a_run_measures_its_own_peak_memory_not_that_of_earlier_runs_in_the_process():
    """In a fresh process, so that no earlier test's resident memory or reset is in the way: an
    "earlier run" of 400 MiB is freed, then a run's peak is measured from its reset."""
    import subprocess
    import sys
    from pathlib import Path

    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("Linux only: /proc/self/clear_refs")
    script = """
import json, resource
from pathlib import Path
import numpy as np
from benchmarks.core import environment
earlier_run = np.ones(400 * 2**20 // 8)  # 400 MiB resident, then freed
del earlier_run
process_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
environment.reset_peak_memory("cpu")
run = environment.peak_memory("cpu")
environment._CLEAR_REFS = Path("/nonexistent/clear_refs")  # no reset possible
environment.reset_peak_memory("cpu")
fallback = environment.peak_memory("cpu")
print(json.dumps({"process_peak": process_peak, "run": run, "fallback": fallback,
                  "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""
    out = json.loads(
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    )
    memory, kind = out["run"]
    assert kind == "cpu_run_peak_rss" and memory < out["process_peak"] - 300 * 2**20
    memory, kind = out["fallback"]
    assert kind == "cpu_process_peak_rss" and memory == out["maxrss"]


@pytest.mark.slow
def test_results_and_sidecars_get_the_mode_of_any_new_file(finished):
    import os

    _, path, _ = finished
    umask = os.umask(0)
    os.umask(umask)
    for written in (path, predictions_path(path)):  # not mkstemp's owner-only 0600
        assert written.stat().st_mode & 0o777 == 0o666 & ~umask
