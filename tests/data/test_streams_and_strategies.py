"""Streams from explicit class orders, the strategy registry, and the base strategy's contract."""

import dataclasses

import pytest
import torch

from benchmarks.backbone import BackboneSpec, create_clip
from benchmarks.core.errors import UserError
from benchmarks.data.class_orders import seeded_order
from benchmarks.data.datasets import load_dataset
from benchmarks.data.streams import build_stream, split_classes
from benchmarks.data.transforms import eval_transform, train_transform
from strategies.base import CLIPStrategy, StrategyConfig
from strategies.registry import available, get_strategy


@pytest.fixture(scope="module")
def small_data():
    return load_dataset("synthetic", None, n_train_per_class=3, n_test_per_class=2)


def _stream(data, n_tasks=10):
    return build_stream(data, n_tasks, seeded_order(100), train_transform(32), eval_transform(32))


def test_split_classes_is_equal_disjoint_and_in_order():
    tasks = split_classes(list(range(9, -1, -1)), 5)
    assert tasks == [[9, 8], [7, 6], [5, 4], [3, 2], [1, 0]]
    with pytest.raises(UserError, match="divide"):
        split_classes(list(range(100)), 7)


@pytest.mark.parametrize("n_tasks", [5, 10, 20])
def test_stream_follows_the_explicit_order_without_touching_global_rng(small_data, n_tasks):
    state = torch.get_rng_state()
    stream = _stream(small_data, n_tasks)
    assert torch.equal(state, torch.get_rng_state())
    order = seeded_order(100)
    assert stream.tasks[0] == order[: 100 // n_tasks]
    assert len(stream.train_stream) == n_tasks
    for task, experience in enumerate(stream.train_stream):
        assert set(experience.classes_in_this_experience) == set(stream.tasks[task])
        assert sorted(set(experience.dataset.targets)) == sorted(stream.tasks[task])
        assert len(experience.dataset) == 3 * len(stream.tasks[task])
    assert len(stream.test_set) == 200 and stream.task_of_class[order[-1]] == n_tasks - 1


def test_stream_applies_train_and_eval_transforms(small_data):
    stream = _stream(small_data)
    image, label = stream.test_set[0][:2]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32
    assert torch.equal(stream.test_set[0][0], stream.test_set[0][0])  # eval is deterministic


def test_registry_finds_strategies_and_reports_unknown_names():
    assert {"continual_clip", "finetune"} <= set(available())
    assert issubclass(get_strategy("finetune"), CLIPStrategy)
    assert get_strategy("strategies.finetune:Finetune") is get_strategy("finetune")
    with pytest.raises(UserError, match="available"):
        get_strategy("nope")
    with pytest.raises(UserError, match="module.path:ClassName"):
        get_strategy("no_module_given:")


def _import_error(name: str) -> str:
    with pytest.raises(UserError) as error:
        get_strategy(name)
    return str(error.value)


def test_a_module_class_strategy_that_cannot_be_imported_says_why(tmp_path, monkeypatch):
    (tmp_path / "outside_strategy.py").write_text("class OutsideStrategy:\n    pass\n")
    (tmp_path / "broken_strategy.py").write_text("import os\nimport no_such_package_of_theirs\n")
    (tmp_path / "bad_name_strategy.py").write_text("from os import no_such_name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # the module is on no path: how to put it there
    assert _import_error("not_installed_pkg.strategy:Thing") == (
        "cannot import strategy 'not_installed_pkg.strategy:Thing': no module named 'not_installed_pkg' "
        "on the Python path; install the strategy's package with pip install -e PATH (the folder of its "
        "pyproject.toml), or put the folder that holds 'not_installed_pkg' on PYTHONPATH "
        "(e.g. PYTHONPATH=examples/my_strategy)"
    )
    assert _import_error("strategies.no_such_file:Thing") == (
        "cannot import strategy 'strategies.no_such_file:Thing': package 'strategies' has no module "
        "'no_such_file'; check the module path before the colon"
    )
    # the module is there, the class is not
    assert _import_error("outside_strategy:OutsideStrategyy") == (
        f"cannot import strategy 'outside_strategy:OutsideStrategyy': module 'outside_strategy' "
        f"({tmp_path / 'outside_strategy.py'}) has no class 'OutsideStrategyy'; "
        "did you mean 'OutsideStrategy'?"
    )
    assert get_strategy("outside_strategy:OutsideStrategy").__name__ == "OutsideStrategy"
    # the module is there and fails to import something itself: a bug in it, named, not "missing"
    assert _import_error("broken_strategy:Thing") == (
        "cannot import strategy 'broken_strategy:Thing': module 'broken_strategy' was found, but an import "
        f"inside it failed (ModuleNotFoundError at {tmp_path / 'broken_strategy.py'}:2: No module named "
        "'no_such_package_of_theirs'); install what it needs or fix that import"
    )
    assert _import_error("bad_name_strategy:Thing").startswith(
        "cannot import strategy 'bad_name_strategy:Thing': module 'bad_name_strategy' was found, but an "
        f"import inside it failed (ImportError at {tmp_path / 'bad_name_strategy.py'}:1: cannot import "
        "name 'no_such_name' from 'os'"
    )


def test_config_rejects_unknown_options_with_the_valid_ones():
    valid = sorted(f.name for f in dataclasses.fields(StrategyConfig))
    with pytest.raises(UserError) as error:
        StrategyConfig.from_dict({"epocs": 3}, "finetune")
    assert str(error.value) == (
        f"unknown option 'epocs' (did you mean 'epochs'?) for strategy finetune; valid options: {valid}"
    )
    assert error.value.options == ("epocs",)
    with pytest.raises(UserError) as error:
        StrategyConfig.from_dict({"zzz": 1, "lrr": 0.1}, "finetune")
    assert str(error.value) == (
        f"unknown options 'lrr' (did you mean 'lr'?), 'zzz' for strategy finetune; valid options: {valid}"
    )
    assert error.value.options == ("lrr", "zzz")
    assert StrategyConfig.from_dict({"epochs": 3}).epochs == 3


def test_finetune_trains_only_its_lora_and_scores_all_seen_classes(small_data):
    torch.manual_seed(0)
    stream = _stream(small_data)
    backbone = create_clip(BackboneSpec("tiny-clip-32", None))
    base = {k: v.clone() for k, v in backbone.model.state_dict().items() if "lora" not in k}
    cls = get_strategy("finetune")
    strategy = cls(
        backbone=backbone,
        class_names=stream.class_names,
        config=cls.Config(epochs=1, batch_size=16, lora_rank=4, lora_alpha=4.0),
        show_progress=False,
    )
    for task in range(2):
        strategy.learn(stream.train_stream[task])
    assert strategy.seen_classes == sorted(stream.tasks[0]) + sorted(stream.tasks[1])
    after = {
        k.replace(".base_layer", ""): v for k, v in backbone.model.state_dict().items() if "lora" not in k
    }
    assert after.keys() == base.keys()
    assert all(torch.equal(value, after[key]) for key, value in base.items())  # base frozen
    lora_b = strategy.backbone.lora_state_dict("visual")
    assert any(v.abs().sum() > 0 for k, v in lora_b.items() if "lora_B" in k)  # adapter learned
    scores = strategy.evaluate_dataset(stream.test_set)
    assert scores.shape == (200, 20)
    # scores are cosines of normalised features
    assert scores.abs().max() <= 1.0 + 1e-5
    tensors, meta = strategy.checkpoint_state()
    assert meta["seen_classes"] == strategy.seen_classes and all(k.startswith("lora/") for k in tensors)
