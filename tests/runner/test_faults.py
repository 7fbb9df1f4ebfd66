"""Faults a new user meets: each ends in one line and exit 2 with nothing lost, or the run starts
again and says so (issue "Sweeps beyond one machine", item 8)."""

import errno
import json

import pytest

from analysis.report import main as report_main
from benchmarks import run
from benchmarks.runner import results
from benchmarks.runner.reading import iter_results
from strategies.methods.finetune import Finetune
from tests.helpers import kill_in_task, three_task_suite

SUITE = three_task_suite("finetune", "epochs = 1\nbatch_size = 40\neval_batch_size = 100\nlora_rank = 2")


def _run(tmp_path, suite_text, *extra):
    tmp_path.mkdir(exist_ok=True)
    suite = tmp_path / "suite.toml"
    suite.write_text(suite_text)
    return run.main(["--suite", str(suite), "--results-dir", str(tmp_path / "results"), "--quiet", *extra])


def _one_error_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(("error", "Traceback"))]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


@pytest.mark.parametrize(
    "option, expected",
    [
        ('epochs = "two"', "must be an integer, not str"),
        ("lr = true", "must be a number, not bool"),
        ("epochs = 1.5", "must be an integer, not float"),
    ],
)
def test_an_option_of_the_wrong_type_is_one_line(tmp_path, capsys, option, expected):
    assert _run(tmp_path, SUITE.replace("epochs = 1", option)) == 2
    assert expected in _one_error_line(capsys)


def test_results_dir_naming_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "results").write_text("not a folder")
    assert _run(tmp_path, SUITE) == 2
    assert "is a file, not a folder" in _one_error_line(capsys)


def test_a_diverging_loss_names_run_task_and_epoch_and_keeps_the_finished_tasks(
    tmp_path, capsys, monkeypatch
):
    real_loss = Finetune.compute_loss

    def nan_in_task_2(self, logits, targets):
        loss = real_loss(self, logits, targets)
        return loss * float("nan") if len(self.task_classes) == 1 else loss

    monkeypatch.setattr(Finetune, "compute_loss", nan_in_task_2)
    assert _run(tmp_path, SUITE) == 2
    line = _one_error_line(capsys)
    assert "finetune / synthetic / 3 tasks / seed 0: task 2:" in line and "in epoch 1" in line
    assert "checkpoint after task 1 is kept" in line
    state = json.loads(next((tmp_path / "results" / ".checkpoints").rglob("state.json")).read_text())
    assert state["tasks_done"] == 1
    monkeypatch.setattr(Finetune, "compute_loss", real_loss)
    assert _run(tmp_path, SUITE) == 0
    assert "resumed after task 1" in capsys.readouterr().err


def test_a_real_divergence_with_a_huge_learning_rate_is_one_line(tmp_path, capsys):
    assert _run(tmp_path, SUITE.replace("epochs = 1", "epochs = 3\nlr = 1e9")) == 2
    assert "training loss became nan" in _one_error_line(capsys)


@pytest.mark.slow
def test_a_damaged_checkpoint_restarts_the_run_and_says_so(tmp_path, capsys, monkeypatch):
    assert _run(tmp_path / "clean", SUITE) == 0
    (reference,) = [r for _, r in iter_results(tmp_path / "clean" / "results")]
    revive = kill_in_task(monkeypatch, Finetune, task=3)
    assert _run(tmp_path, SUITE) == 130
    revive()
    (tensors,) = (tmp_path / "results" / ".checkpoints").rglob("task-*.safetensors")
    tensors.write_bytes(tensors.read_bytes()[:100])  # a write cut short
    capsys.readouterr()
    with pytest.warns(UserWarning, match="checkpoint .* is damaged .*starting the run over"):
        assert _run(tmp_path, SUITE) == 0
    (result,) = [r for _, r in iter_results(tmp_path / "results")]
    assert result["stages"] == reference["stages"]


@pytest.mark.slow
def test_a_result_of_another_schema_is_skipped_with_a_line_naming_it(tmp_path, capsys):
    assert _run(tmp_path, SUITE) == 0
    (path,) = (tmp_path / "results").rglob("T3-seed0.json")
    future = json.loads(path.read_text())
    future_path = path.with_name("T3-seed1.json")
    future_path.write_text(json.dumps({**future, "seed": 1, "schema_version": 99}))
    capsys.readouterr()
    assert report_main(["--results-dir", str(tmp_path / "results"), "--out", str(tmp_path / "report")]) == 0
    err = capsys.readouterr().err
    assert f"skipped {future_path}: schema_version 99" in err
    path.unlink()
    assert report_main(["--results-dir", str(tmp_path / "results"), "--out", str(tmp_path / "report")]) == 2
    assert "no result JSON of this schema" in _one_error_line(capsys)
    with pytest.warns(UserWarning, match="schema_version 99"):
        assert list(iter_results(tmp_path / "results")) == []


@pytest.mark.parametrize(
    "change, expected",
    [
        (("tasks = [3]", 'tasks = ["3"]'), "tasks must be whole numbers or splits B<m>-Inc<n>"),
        (("tasks = [3]", "tasks = [0]"), "task counts must be >= 1"),
        (
            ('strategies = ["finetune"]', 'strategies = "finetune"'),
            "strategies must be a non-empty list of names",
        ),
        (("seeds = [0]", "seeds = []"), "seeds must be a non-empty list"),
        (("seeds = [0]", ""), "has no seeds; add e.g. seeds = [0, 1, 2]"),
        (
            ('pretrained = "synthetic"', 'pretrained = "synthetic"\npretrain = "none"'),
            "[backbone] has unknown key(s) ['pretrain']",
        ),
        (("[strategy.finetune]", "[strategy.fintune]"), "there is no strategy 'fintune'"),
        (("[dataset.synthetic]", "[dataset.synthetc]"), "there is no dataset 'synthetc'"),
        (("epochs = 1", "epochs = 0"), "epochs = 0 must be at least 1"),
        (("batch_size = 40", "batch_size = 0"), "batch_size = 0 must be at least 1"),
        (("epochs = 1", "epochs = 1\nlr = -0.1"), "lr = -0.1 must be positive"),
        (("n_test_per_class = 4", "n_test_per_class = 0"), "needs n_test_per_class >= 1"),
        (("n_classes = 15", "n_classes = 15\nn_clases = 3"), "does not take option(s) n_clases; valid"),
    ],
)
def test_a_slip_in_the_suite_file_is_one_line_and_runs_nothing(tmp_path, capsys, change, expected):
    """Each was a traceback, or silently ran something else (no training, an ignored table)."""
    assert change[0] in SUITE
    assert _run(tmp_path, SUITE.replace(*change)) == 2
    assert expected in _one_error_line(capsys)
    assert not list((tmp_path / "results").rglob("*.json"))


def test_continual_clip_still_trains_nothing_by_default():
    from strategies.methods.continual_clip import ContinualCLIP

    assert ContinualCLIP.Config.from_dict({}).epochs == 0


def test_a_checkpoint_that_cannot_be_written_is_one_line_naming_the_run(tmp_path, capsys, monkeypatch):
    real_state = Finetune.checkpoint_state

    def unwritable_after_task_2(self):
        if len(self.task_classes) == 2:
            raise TypeError("cannot checkpoint a generator holding <generator object>")
        return real_state(self)

    monkeypatch.setattr(Finetune, "checkpoint_state", unwritable_after_task_2)
    assert _run(tmp_path, SUITE) == 2
    line = _one_error_line(capsys)
    assert line.startswith(
        "error: finetune / synthetic / 3 tasks / seed 0: task 2: cannot write its checkpoint"
    )
    assert "TypeError: cannot checkpoint a generator" in line and "checkpoint after task 1 is kept" in line


def test_a_model_that_cannot_be_saved_is_one_line_naming_the_run(tmp_path, capsys, monkeypatch):
    def unwritable(self, path, extra=None):
        raise ValueError("tensors share memory")

    monkeypatch.setattr(Finetune, "save_model", unwritable)
    assert _run(tmp_path, SUITE, "--save-models") == 2
    line = _one_error_line(capsys)
    assert line.startswith(
        "error: finetune / synthetic / 3 tasks / seed 0: cannot write its model (--save-models)"
    )
    assert "ValueError: tensors share memory" in line and "checkpoint after task 3 is kept" in line


def test_a_full_disk_is_one_line_and_the_finished_tasks_are_kept(tmp_path, capsys, monkeypatch):
    real_save = results.write_tensors
    calls = {"n": 0}

    def full_on_second_checkpoint(path, tensors):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_save(path, tensors)

    monkeypatch.setattr(results, "write_tensors", full_on_second_checkpoint)
    assert _run(tmp_path, SUITE) == 2
    line = _one_error_line(capsys)
    assert "No space left on device" in line and "finished tasks are kept" in line
    state = json.loads(next((tmp_path / "results" / ".checkpoints").rglob("state.json")).read_text())
    assert state["tasks_done"] == 1
    monkeypatch.setattr(results, "write_tensors", real_save)
    assert _run(tmp_path, SUITE) == 0
    assert "resumed after task 1" in capsys.readouterr().err
