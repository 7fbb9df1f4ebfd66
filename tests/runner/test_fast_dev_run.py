"""``--fast-dev-run``: its caps, its data, its results folder and its marks, and the tables, report
and comparison that never take its results for measurements."""

import pytest
import torch

from analysis import paired_runs, pairing, tables
from analysis.paper_inputs import load_inputs
from benchmarks import run
from benchmarks.data.loaders import seeded_loader
from benchmarks.data.streams import spread_indices
from benchmarks.runner.building import resolve
from benchmarks.runner.limits import RunLimits
from benchmarks.runner.reading import iter_results, not_a_measurement
from benchmarks.runner.result_record import RunResult, config_hash
from benchmarks.runner.suites import expand
from tests.analysis.records import run_result
from tests.helpers import MINI_SUITE, result_of, write_suite


def test_spread_indices_reaches_every_task_then_every_class_before_a_second_image():
    # classes 0, 1 in task 0 and 2, 3 in task 1; index -> class
    targets = [0, 0, 0, 1, 1, 2, 2, 3, 3, 3]
    tasks = {0: 0, 1: 0, 2: 1, 3: 1}
    # rank 0 first: class 0 (task 0), class 2 (task 1), class 1 (task 0), class 3 (task 1)
    assert spread_indices(targets, tasks, limit=2) == [0, 5]
    assert spread_indices(targets, tasks, limit=3) == [0, 3, 5]
    assert spread_indices(targets, tasks, per_class=1) == [0, 3, 5, 7]
    assert spread_indices(targets, tasks, limit=6) == [0, 1, 3, 5, 6, 7]
    assert spread_indices(targets, {0: 0, 3: 0}, per_class=2) == [0, 1, 7, 8]  # other classes left out


def test_a_capped_loader_gives_the_full_loaders_first_batches_every_pass():
    data = torch.utils.data.TensorDataset(torch.arange(20.0))
    full = seeded_loader(data, (0, 1, "train"), 3, shuffle=True)
    capped = seeded_loader(data, (0, 1, "train"), 3, shuffle=True, train_batches=2)
    assert len(full) == 7 and len(capped) == 2
    for _ in range(2):  # each pass (epoch) ends after two batches, and the next pass reshuffles
        expected = [batch[0].tolist() for batch in full][:2]
        assert [batch[0].tolist() for batch in capped] == expected
    assert len(seeded_loader(data, (0, 1, "x"), 3, train_batches=50)) == 7


def _mini_runs(limits=None):
    suite = {**__import__("tomllib").loads(MINI_SUITE), "name": "mini"}
    return expand(suite, strategies=["finetune"], limits=limits)


def test_a_fast_dev_run_caps_epochs_and_training_batch_sizes_and_says_so():
    (real,) = _mini_runs()
    (fast,) = _mini_runs(RunLimits.fast_dev_run(3))
    real_run, fast_run = resolve(real, "data"), resolve(fast, "data")
    real_cfg, real_config = real_run.strategy_cfg, real_run.config
    fast_cfg, fast_config = fast_run.strategy_cfg, fast_run.config
    assert (real_cfg.epochs, real_cfg.batch_size, real_cfg.eval_batch_size) == (2, 32, 200)
    assert (fast_cfg.epochs, fast_cfg.batch_size, fast_cfg.eval_batch_size) == (1, 2, 200)
    assert fast_config["option_sources"]["batch_size"] == "defaults capped by --fast-dev-run"
    assert fast_config["fast_dev_run"] == {
        "train_batches": 3,
        "max_batch_size": 2,
        "train_per_class": 1,
        "test_per_task": 1,
        "zero_shot_images": 10,
        "zero_shot_classes": 10,
    }
    assert "fast_dev_run" not in real_config and config_hash(fast_config) != config_hash(real_config)


def test_a_fake_data_root_marks_every_result_config(tmp_path):
    (spec,) = _mini_runs()
    spec = spec.__class__(**{**spec.__dict__, "dataset": "cifar100"})
    real = resolve(spec, str(tmp_path)).config
    (tmp_path / "FAKE_DATA.json").write_text("{}")
    fake = resolve(spec, str(tmp_path)).config
    assert "fake_data" not in real and fake["fake_data"] is True
    assert config_hash(fake) != config_hash(real)
    assert not_a_measurement(run_result("finetune", config=fake)) == "fake data"


@pytest.fixture(scope="module")
def fast_results(tmp_path_factory):
    """The mini suite's two strategies as a fast dev run, into the default folder, and a real run
    of fine-tuning beside it in another folder."""
    root = tmp_path_factory.mktemp("fast")
    suite = write_suite(root / "mini.toml", MINI_SUITE)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        assert run.main(["--suite", suite, "--quiet", "--fast-dev-run"]) == 0
        assert run.main(["--suite", suite, "--quiet", "--strategies", "finetune"]) == 0
    return root


@pytest.mark.slow
def test_a_fast_dev_run_walks_every_stage_on_a_few_images(fast_results):
    results = {r["label"]: r for _, r in iter_results(fast_results / "runs" / "mini-fast-dev-run")}
    assert sorted(results) == ["continual_clip", "finetune"]
    for result in results.values():
        assert len(result["stages"]) == 5 and result["config"]["fast_dev_run"]["train_batches"] == 2
        # one test image a task, spread over the tasks: each learned task is scored at each stage
        assert [sum(s["n_test_per_task"]) for s in result["stages"]] == [1, 2, 3, 4, 5]
    # fine-tuning trains 2 batches a task, whatever its epochs and data
    assert results["finetune"]["cost"]["train_steps"] == 5 * 2
    assert results["finetune"]["config"]["strategy_config"]["epochs"] == 1
    real = [r for _, r in iter_results(fast_results / "runs" / "mini")]
    assert len(real) == 1 and "fast_dev_run" not in real[0]["config"]


@pytest.mark.slow
def test_tables_report_and_comparison_never_take_a_fast_dev_run_for_a_measurement(fast_results, capsys):
    runs = fast_results / "runs"
    markdown = tables.write_tables(runs / "mini-fast-dev-run")
    assert "**Not measurements**: 2 of 2 runs are a fast dev run" in markdown
    assert "Not measurements" not in tables.write_tables(runs / "mini")
    # beside a real run, fast dev runs are left out of the report, with a note
    mixed = load_inputs(runs)
    assert [run.label for run in mixed.runs] == ["finetune"] and "fast_dev_run" not in mixed.runs[0].config
    assert any(note.startswith("left out 2 fast-dev-run result(s) (the first: ") for note in mixed.notes)
    # read alone, they are what there is, marked
    notes = load_inputs(runs / "mini-fast-dev-run").notes
    assert any(note.startswith("2 result(s) are a fast dev run") for note in notes)
    # a fast dev run and a real run are two protocols: the comparison refuses to pair them
    fast = paired_runs.Run(RunResult.from_json(result_of(runs / "mini-fast-dev-run", "finetune")))
    (real,) = [paired_runs.Run(RunResult.from_json(r)) for _, r in iter_results(runs / "mini")]
    assert paired_runs.protocol_difference(paired_runs.protocol(fast), real) == "fast dev run"
    # among fast dev runs alone, it compares and warns
    problems: list[str] = []
    pairing.compare_all(runs / "mini-fast-dev-run", "finetune", draws=100, problems=problems)
    assert any(line.startswith("2 run(s) are a fast dev run") for line in problems)


def test_fast_dev_run_and_dry_run_list_the_marked_runs(tmp_path, capsys):
    suite = write_suite(tmp_path / "mini.toml", MINI_SUITE)
    assert (
        run.main(["--suite", suite, "--fast-dev-run", "--dry-run", "--results-dir", str(tmp_path / "r")]) == 0
    )
    assert "2 run(s)" in capsys.readouterr().out
    assert run.main(["--suite", suite, "--fast-dev-run", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: --fast-dev-run takes a whole number of batches >= 1")
