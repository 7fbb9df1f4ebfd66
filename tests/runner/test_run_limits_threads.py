"""A run's explicit limits (``suites.RunLimits``), the public run builder (``building.build_run``),
torch threads (``--threads``) and the per-task lines a log gets instead of progress bars."""

import dataclasses
from typing import ClassVar

import numpy as np
import pytest

from benchmarks import run, run_suite
from benchmarks.core.environment import auto_threads, check_threads, usable_cores
from benchmarks.core.errors import UserError
from benchmarks.runner.building import _limited_config, build_run, resolve
from benchmarks.runner.limits import RunLimits
from benchmarks.runner.reading import iter_results
from benchmarks.runner.suites import expand, load_suite
from strategies.config import StrategyConfig
from strategies.contract import config_class
from strategies.registry import available, get_strategy


def test_a_real_run_has_no_limits_and_a_fast_dev_run_has_each_one_explicitly():
    assert all(value is None for value in dataclasses.asdict(RunLimits()).values())
    assert not RunLimits().limited and RunLimits().record() is None
    fast = RunLimits.fast_dev_run(3)
    assert fast == RunLimits(
        epochs=1,
        train_batches=3,
        batch_size=2,
        train_images_per_class=1,
        test_images_per_task=1,
        zero_shot_images=10,
        zero_shot_classes=10,
    )
    assert RunLimits.fast_dev_run() == dataclasses.replace(fast, train_batches=2)
    # the names results have always recorded (hashed), one per number
    assert fast.record() == {
        "train_batches": 3,
        "max_batch_size": 2,
        "train_per_class": 1,
        "test_per_task": 1,
        "zero_shot_images": 10,
        "zero_shot_classes": 10,
    }
    for bad in (0, -1, True):
        with pytest.raises(UserError, match="--fast-dev-run takes a whole number of batches >= 1"):
            RunLimits.fast_dev_run(bad)


@pytest.mark.parametrize("name", available())
def test_every_training_batch_size_of_a_config_is_declared(name):
    """A fast dev run caps the fields a Config declares (``training_batch_sizes``), not fields it
    guesses from their names; this guards a new field nobody declared."""
    config = config_class(get_strategy(name))
    sizes = {f.name for f in dataclasses.fields(config) if f.name.endswith("batch_size")}
    assert set(config.training_batch_sizes) == sizes - {"eval_batch_size"}


@pytest.mark.parametrize("name", available())
def test_every_count_of_training_passes_of_a_config_is_declared(name):
    """A fast dev run makes one pass of every training loop a Config counts (``training_epochs``: a
    second stage's, a probe's), so that it walks each loop without its official number of passes."""
    config = config_class(get_strategy(name))
    counts = {f.name for f in dataclasses.fields(config) if f.name == "epochs" or f.name.endswith("_epochs")}
    assert set(config.training_epochs) == counts


def test_a_fast_dev_run_caps_each_declared_count_of_passes_and_the_scale_only_epochs():
    @dataclasses.dataclass
    class Config(StrategyConfig):
        epochs: int = 5
        head_epochs: int = 3
        warm_epochs: int = 4  # not declared: stays
        training_epochs: ClassVar[tuple[str, ...]] = ("epochs", "head_epochs")

    sources = {name: "default" for name in Config().to_dict()}
    capped = _limited_config(Config(), RunLimits(epochs=1), sources)
    assert (capped.epochs, capped.head_epochs, capped.warm_epochs) == (1, 1, 4)
    assert {k for k, v in sources.items() if "capped" in v} == {"epochs", "head_epochs"}
    scaled, changed = Config().with_epoch_scale(0.5)  # a suite's epoch_scale: the task's epochs only
    assert (scaled.epochs, scaled.head_epochs, changed) == (2, 3, ["epochs"])


def test_limits_cap_the_declared_batch_sizes_and_the_epochs_and_nothing_else():
    @dataclasses.dataclass
    class Config(StrategyConfig):
        epochs: int = 5
        batch_size: int = 64
        replay_batch_size: int = 32  # not declared: stays
        head_batch_size: int = 16
        training_batch_sizes: ClassVar[tuple[str, ...]] = ("batch_size", "head_batch_size")

    sources = {name: "default" for name in Config().to_dict()}
    capped = _limited_config(Config(), RunLimits(epochs=1, batch_size=2), sources)
    assert (capped.epochs, capped.batch_size, capped.head_batch_size) == (1, 2, 2)
    assert (capped.replay_batch_size, capped.eval_batch_size) == (32, 256)
    assert {k for k, v in sources.items() if "capped" in v} == {"epochs", "batch_size", "head_batch_size"}
    assert _limited_config(Config(), RunLimits(), dict(sources)) == Config()


@pytest.mark.slow  # a suite run (README: the fast tier's rule)
def test_build_run_gives_the_stream_and_strategy_the_runner_trains(mini_suite, tmp_path):
    """Task 1 learnt on ``build_run``'s strategy scores the test set exactly as the runner's stage 1."""
    from benchmarks.core.environment import seed_everything
    from benchmarks.core.metrics import stage_metrics
    from strategies.contract import evaluate

    assert (
        run.main(
            ["--suite", mini_suite, "--results-dir", str(tmp_path), "--quiet", "--strategies", "finetune"]
        )
        == 0
    )
    (stored,) = [r for _, r in iter_results(tmp_path)]
    (spec,) = expand(load_suite(mini_suite), strategies=["finetune"])
    built = build_run(resolve(spec, "data"), "data")
    assert built.config == resolve(spec, "data").config
    assert built.stream.class_order == stored["class_order"]
    seed_everything(spec.seed, 0)
    built.strategy.learn(built.stream.train_stream[0])
    scores = evaluate(built.strategy, built.stream.test_set, 200, "cpu", cache_key="test").numpy()
    stream = built.stream
    targets = np.asarray(stream.test_targets)
    metrics = stage_metrics(scores, built.strategy.seen_classes, targets, stream.task_of_class, 1)
    assert metrics["acc"] == stored["stages"][0]["acc"]


def test_threads_take_a_number_or_auto_and_refuse_anything_else_in_one_line():
    assert [check_threads(v) for v in ("auto", 2, "3")] == ["auto", 2, 3]
    for bad in (0, "0", "x", True, 1.5):
        with pytest.raises(UserError, match="threads must be a whole number >= 1"):
            check_threads(bad)
    assert auto_threads("cpu") == 1 and auto_threads("cuda") == usable_cores()


@pytest.mark.slow  # a suite run (README: the fast tier's rule)
def test_threads_are_recorded_in_the_env_and_not_hashed(mini_suite, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(run_suite, "usable_cores", lambda: 2)  # --threads 2 is refused on one core
    argv = [
        "--suite",
        mini_suite,
        "--results-dir",
        str(tmp_path),
        "--quiet",
        "--strategies",
        "continual_clip",
    ]
    assert run.main([*argv, "--threads", "2"]) == 0
    (first,) = [r for _, r in iter_results(tmp_path)]
    assert (first["env"]["torch_threads"], first["env"]["threads_setting"]) == (2, 2)
    capsys.readouterr()
    assert run.main(argv) == 0  # "auto": one thread on the CPU; the finished run is the same run
    assert ": cached;" in capsys.readouterr().err
    assert run.main([*argv, "--threads", "none"]) == 2
    assert "threads must be a whole number" in capsys.readouterr().err


@pytest.mark.slow  # a suite run (README: the fast tier's rule)
def test_a_log_gets_one_line_per_task_and_no_progress_bar(mini_suite, tmp_path, capsys):
    """Under pytest stderr is not a terminal, as in CI, nohup or a SLURM log."""
    argv = ["--suite", mini_suite, "--results-dir", str(tmp_path), "--strategies", "finetune"]
    assert run.main(argv) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if ": task " in line]
    assert [line.split(": task ")[1].split(":")[0] for line in lines] == [f"{t}/5" for t in range(1, 6)]
    assert "\r" not in err and "\x1b[" not in err  # no bar redraws, no cursor movement
    assert run.main([*argv, "--quiet", "--force"]) == 0
    assert ": task " not in capsys.readouterr().err
