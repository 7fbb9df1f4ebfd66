"""``--log tensorboard,wandb,csv``: each log holds the run's numbers, read back and checked against
its result JSON; a logger that cannot start stops the command in one line before any training."""

import csv
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from benchmarks import run
from benchmarks.runner.reading import iter_results
from tests.helpers import MINI_SUITE, write_suite

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    root = tmp_path_factory.mktemp("logged")
    suite = write_suite(root / "mini.toml", MINI_SUITE)
    results = root / "results"
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("WANDB_MODE", raising=False)  # the suite's default: offline
        patch.setenv("WANDB_SILENT", "true")
        argv = ["--suite", suite, "--results-dir", str(results), "--quiet", "--strategies", "finetune"]
        assert run.main([*argv, "--log", "tensorboard,wandb,csv"]) == 0
    (result,) = [r for _, r in iter_results(results)]
    return results, result


def _tensorboard(results) -> dict[str, list[tuple[int, float]]]:
    (folder,) = {p.parent for p in (results / ".logs" / "tensorboard").rglob("events.out.tfevents.*")}
    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_holds_every_stage_and_every_training_iteration(logged):
    results, result = logged
    scalars = _tensorboard(results)
    assert [value for _, value in scalars["stage/acc"]] == pytest.approx([s["acc"] for s in result["stages"]])
    assert [value for _, value in scalars["stage/routing_acc"]] == pytest.approx(
        [s["routing_acc"] for s in result["stages"]]
    )
    assert [v for _, v in scalars["stage/auroc"]] == pytest.approx(
        [s["auroc"] for s in result["stages"][:-1]]
    )
    assert [v for _, v in scalars["stage/acc_task_1"]] == pytest.approx(
        [s["acc_per_task"][0] for s in result["stages"]]
    )
    # one loss and one learning rate per iteration, on one step axis 1..train_steps
    steps = result["cost"]["train_steps"]
    assert [step for step, _ in scalars["train/loss"]] == list(range(1, steps + 1))
    assert len(scalars["train/lr"]) == steps
    # each stage sits at the iteration that ended its task
    stage_steps = [step for step, _ in scalars["stage/acc"]]
    assert stage_steps[-1] == steps and stage_steps == sorted(stage_steps)
    # the cosine schedule: the learning rate falls within each task (5 tasks, equal length)
    per_task = steps // 5
    first_task = [v for _, v in scalars["train/lr"][:per_task]]
    assert first_task[0] > first_task[-1]


def test_csv_holds_the_same_numbers(logged):
    results, result = logged
    (path,) = (results / ".logs" / "csv").rglob("*.csv")
    assert path.name == "T5-seed0.csv"
    with open(path) as handle:
        rows = list(csv.DictReader(handle))
    accs = [float(row["value"]) for row in rows if row["name"] == "stage/acc"]
    assert accs == pytest.approx([s["acc"] for s in result["stages"]])
    losses = [row for row in rows if row["name"] == "train/loss"]
    assert len(losses) == result["cost"]["train_steps"]
    tensorboard = _tensorboard(results)["train/loss"]
    assert [float(row["value"]) for row in losses] == pytest.approx([v for _, v in tensorboard])


def test_wandb_runs_offline_and_writes_its_run_folder(logged):
    results, result = logged
    (folder,) = list((results / ".logs" / "wandb").glob("offline-run-*"))
    assert any(folder.rglob("*.wandb"))


def test_an_unknown_logger_or_a_missing_package_is_one_line_before_any_training(
    tmp_path, capsys, monkeypatch
):
    suite = write_suite(tmp_path / "mini.toml", MINI_SUITE)
    argv = ["--suite", suite, "--results-dir", str(tmp_path / "r"), "--quiet"]
    assert run.main([*argv, "--log", "tensorboard,mlflow"]) == 2
    assert (
        capsys.readouterr().err == "error: unknown logger 'mlflow' in --log; valid: tensorboard, wandb, csv\n"
    )
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if it were not installed
    assert run.main([*argv, "--log", "wandb"]) == 2
    assert capsys.readouterr().err == "error: --log wandb needs the wandb package: pip install wandb\n"
    assert not (tmp_path / "r").exists()  # nothing ran, nothing was written
