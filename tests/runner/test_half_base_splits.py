"""Half-base splits in suites and on the command line: ``tasks = [10, "B50-Inc10"]`` and
``--tasks 10,B50-Inc10`` resolve each entry to one run; a split that gives equal tasks is exactly the
task count's run (config, hash and file), and a half-base one records its split."""

import pytest

from benchmarks import run
from benchmarks.core.errors import UserError
from benchmarks.runner.building import resolve
from benchmarks.runner.suites import expand, load_suite
from benchmarks.runner.task_splits import resolve_tasks
from tests.helpers import tiny_suite, write_suite


def _specs(tmp_path, tasks, **options):
    suite = tiny_suite(["finetune"]) + "[dataset.synthetic]\nn_train_per_class = 2\n"
    return expand(load_suite(write_suite(tmp_path / "suite.toml", suite)), tasks=tasks, **options)


def test_entries_resolve_to_a_split_and_its_task_count():
    assert resolve_tasks(10, "synthetic", {}) == ("", 10)
    assert resolve_tasks("B50-Inc10", "synthetic", {}) == ("B50-Inc10", 6)
    assert resolve_tasks("B050-Inc10", "cifar100", {}) == ("B50-Inc10", 6)  # one name for one split
    assert resolve_tasks("B0-Inc30", "synthetic", {}) == ("B0-Inc30", 4)  # 30, 30, 30, 10
    assert resolve_tasks("B0-Inc10", "synthetic", {}) == ("", 10)  # equal tasks: the count's run
    assert resolve_tasks("B50-Inc50", "synthetic", {}) == ("", 2)
    # the class count under the dataset's options: 40 synthetic classes
    assert resolve_tasks("B20-Inc10", "synthetic", {"n_classes": 40}) == ("B20-Inc10", 3)
    assert resolve_tasks("B100-Inc100", "imagenet_r", {}) == ("", 2)  # 200 classes


def test_a_split_equal_to_a_task_count_is_the_same_run_hash_and_file(tmp_path):
    (ten,) = _specs(tmp_path, [10])
    (b0,) = _specs(tmp_path, ["B0-Inc10"])
    assert b0.config == ten.config and resolve(b0, ".").config_hash == resolve(ten, ".").config_hash
    assert "split" not in ten.config and b0.key == ten.key and b0.key.stem == "T10-seed0"
    assert len(_specs(tmp_path, [10, "B0-Inc10"])) == 1  # asked twice, run once


def test_a_half_base_run_records_its_split_and_its_real_task_count(tmp_path):
    ten, half = _specs(tmp_path, [10, "B50-Inc10"])
    assert half.config["split"] == "B50-Inc10" and half.config["n_tasks"] == half.n_tasks == 6
    assert half.split == "B50-Inc10" and half.tasks == "B50-Inc10" and ten.tasks == 10 and ten.split == ""
    assert half.key.stem == "B50-Inc10-T6-seed0" and str(half.key).endswith("B50-Inc10 (6 tasks) / seed 0")
    assert {k: v for k, v in half.config.items() if k not in ("split", "n_tasks")} == {
        k: v for k, v in ten.config.items() if k != "n_tasks"
    }
    assert resolve(half, ".").config_hash != resolve(ten, ".").config_hash


def test_a_split_from_the_suite_file(tmp_path):
    text = tiny_suite(["finetune"]).replace("tasks = [5]", 'tasks = [5, "B50-Inc25"]')
    specs = expand(load_suite(write_suite(tmp_path / "suite.toml", text)))
    assert [(s.split, s.n_tasks) for s in specs] == [("", 5), ("B50-Inc25", 3)]


@pytest.mark.parametrize(
    "tasks, match",
    [
        (["B100-Inc10"], "split B100-Inc10 does not fit the 100 classes of synthetic"),
        (["B50-Inc0"], "tasks must be whole numbers or splits B<m>-Inc<n>"),
        (["B50+10"], "tasks must be whole numbers or splits"),
        ([0], "task counts must be >= 1"),
    ],
)
def test_a_split_that_does_not_fit_is_one_line(tmp_path, tasks, match):
    with pytest.raises(UserError, match=match) as err:
        _specs(tmp_path, tasks)
    assert "\n" not in str(err.value)


def test_a_suite_file_with_a_malformed_split_is_one_line(tmp_path):
    text = tiny_suite(["finetune"]).replace("tasks = [5]", 'tasks = ["B50-inc10"]')
    with pytest.raises(UserError, match="tasks must be whole numbers or splits B<m>-Inc<n>"):
        load_suite(write_suite(tmp_path / "suite.toml", text))


def test_the_command_line_takes_counts_and_splits(tmp_path, capsys):
    args = run.parse_args(["--tasks", "10,B50-Inc10"])
    assert args.tasks == [10, "B50-Inc10"]
    suite = write_suite(tmp_path / "suite.toml", tiny_suite(["finetune"]))
    code = run.main(
        ["--suite", suite, "--tasks", "10,B50-Inc10", "--dry-run", "--results-dir", str(tmp_path / "r")]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "finetune / synthetic / 10 tasks / seed 0 | to run" in out
    assert "finetune / synthetic / B50-Inc10 (6 tasks) / seed 0 | to run" in out
    assert run.main(["--suite", suite, "--tasks", "B50-Inc100x", "--dry-run"]) == 2
    assert "tasks must be whole numbers or splits" in capsys.readouterr().err


def test_gpu_hours_count_the_classes_of_the_tasks_left():
    from benchmarks.runner.building import resolve
    from benchmarks.runner.gpu_hours import run_images

    ten, half = expand(
        load_suite("main"),
        strategies=["gr4cil"],
        datasets=["cifar100"],
        tasks=[10, "B50-Inc10"],
        seeds=[0],
        device="cpu",
    )
    epochs = resolve(half, "data").config["strategy_config"]["epochs"]
    assert epochs == 70
    # By hand: CIFAR-100's 50,000 training and 10,000 test images; B50-Inc10's tasks hold 50, then
    # 10 classes each: after the base, half the training set is left; after 3 tasks, 30 classes
    assert run_images(half, resolve(half, "data").config, 0) == (70 * 50_000, 6 * 10_000)
    assert run_images(half, resolve(half, "data").config, 1) == (70 * 50_000 * 50 / 100, 5 * 10_000)
    assert run_images(half, resolve(half, "data").config, 3) == (70 * 50_000 * 30 / 100, 3 * 10_000)
    assert run_images(ten, resolve(ten, "data").config, 3) == (70 * 50_000 * 7 / 10, 7 * 10_000)


def _per_dataset_suite(tmp_path, tasks_table: str) -> str:
    text = tiny_suite(["finetune"]).replace(
        'datasets = ["synthetic"]', 'datasets = ["synthetic", "cifar100"]'
    )
    return write_suite(tmp_path / "suite.toml", text.replace("tasks = [5]", f"tasks = {tasks_table}"))


def test_a_tasks_table_gives_each_dataset_its_own_entries(tmp_path):
    """The LAMDA suites' form: each dataset at its papers' increment; --tasks still overrides all."""
    suite = load_suite(
        _per_dataset_suite(tmp_path, '{synthetic = ["B50-Inc25"], cifar100 = [10, "B0-Inc20"]}')
    )
    runs = [(s.dataset, s.split, s.n_tasks) for s in expand(suite)]
    assert runs == [("synthetic", "B50-Inc25", 3), ("cifar100", "", 10), ("cifar100", "", 5)]
    assert [(s.dataset, s.n_tasks) for s in expand(suite, tasks=[2])] == [("synthetic", 2), ("cifar100", 2)]


@pytest.mark.parametrize(
    "table, match",
    [
        ("{synthetic = [5]}", r"tasks table has no entry for dataset 'cifar100'"),
        (
            "{synthetic = [5], cifar100 = [5], cub = [5]}",
            r"names dataset\(s\) \['cub'\] the suite does not run",
        ),
        ("{synthetic = [5], cifar100 = []}", "tasks.cifar100 must be a non-empty list"),
        ('{synthetic = [5], cifar100 = ["B0-Inc"]}', "tasks.cifar100: tasks must be whole numbers or splits"),
    ],
)
def test_a_bad_tasks_table_is_one_line(tmp_path, table, match):
    with pytest.raises(UserError, match=match):
        load_suite(_per_dataset_suite(tmp_path, table))
