"""A fair comparison by default: a suite's ``[common]`` table holds the protocol's common settings,
which every strategy inherits, one from outside the suite included, unless its Config declares its
own (its official recipe); ``epoch_scale`` scales every strategy's per-task epochs. Checked through
the resolved config that each run records."""

import pytest

from benchmarks.runner.building import resolve
from benchmarks.runner.suites import available_suites, expand, load_suite
from strategies.registry import get_strategy

EXAMPLES = ("examples/my_strategy", "examples/continual_coop")
MINE = "my_strategy.strategy:MyStrategy"
COOP = "continual_coop.strategy:ContinualCoOp"


@pytest.fixture(autouse=True)
def _examples_on_the_path(monkeypatch):
    for folder in EXAMPLES:
        monkeypatch.syspath_prepend(folder)


def _resolved(suite: str, strategies: list[str]) -> dict[str, dict]:
    runs = expand(load_suite(suite), strategies=strategies, seeds=[0], check_device=False, device="cpu")
    out = {}
    for spec in runs:
        if spec.label not in out:  # the first dataset and task count
            out[spec.label] = resolve(spec, "data").config
    return out


def test_an_outside_strategy_on_smoke_gets_gr4cils_augmentation_and_epoch_scale():
    runs = _resolved("smoke", [MINE, "gr4cil"])
    mine, gr4cil = runs[MINE], runs["gr4cil"]
    for config in (mine, gr4cil):
        assert config["strategy_config"]["train_augmentation"] == "paper-scaled"
        assert config["option_sources"]["train_augmentation"] == "common"
        assert config["epoch_scale"] == 0.125
        assert config["strategy_config"]["eval_batch_size"] == 500  # [defaults]
    assert mine["strategy_config"]["epochs"] == 1  # its own 5, x 0.125 = 0.625, rounded, at least 1
    assert mine["option_sources"]["epochs"] == "default x epoch_scale 0.125"
    assert gr4cil["strategy_config"]["epochs"] == 9  # 70 x 0.125 = 8.75
    assert gr4cil["option_sources"]["epochs"] == "strategy.gr4cil x epoch_scale 0.125"


def test_a_strategy_whose_config_declares_its_own_augmentation_keeps_it():
    runs = _resolved("smoke-baselines", [COOP, "l2p_pp", "mg_clip", "finetune"])
    assert runs[COOP]["strategy_config"]["train_augmentation"] == "rrc_flip"
    assert runs["l2p_pp"]["strategy_config"]["train_augmentation"] == "rrc_flip"
    assert runs["mg_clip"]["strategy_config"]["train_augmentation"] == "none"
    for label in (COOP, "l2p_pp", "mg_clip"):
        assert runs[label]["option_sources"]["train_augmentation"] == "default"
    assert runs["finetune"]["option_sources"]["train_augmentation"] == "common"


def test_recipe_fields_are_what_a_config_declares_below_the_common_base():
    assert "train_augmentation" not in get_strategy("gr4cil").Config.recipe_fields()
    assert "train_augmentation" in get_strategy("l2p_pp").Config.recipe_fields()  # via its PromptConfig
    assert {"epochs", "lr", "lora_rank", "lora_alpha"} == get_strategy(MINE).Config.recipe_fields()
    assert get_strategy("finetune").Config.recipe_fields() == frozenset()  # GR4CIL's protocol, all inherited


@pytest.mark.parametrize("suite", available_suites())
def test_on_every_shipped_suite_an_outside_strategy_gets_gr4cils_protocol(suite):
    """GR4CIL's train augmentation is the common one wherever it is not GR4CIL's own table's, and
    the epoch scale is the same for both."""
    runs = _resolved(suite, [MINE, "gr4cil"])
    mine, gr4cil = runs[MINE], runs["gr4cil"]
    if not gr4cil["option_sources"]["train_augmentation"].startswith(("strategy.", "variants.")):
        assert (
            mine["strategy_config"]["train_augmentation"] == gr4cil["strategy_config"]["train_augmentation"]
        )
        assert mine["option_sources"]["train_augmentation"] == gr4cil["option_sources"]["train_augmentation"]
    assert mine.get("epoch_scale", 1.0) == gr4cil.get("epoch_scale", 1.0)
    for key in ("class_order", "dataset_options", "backbone", "precision", "n_tasks"):
        assert mine[key] == gr4cil[key]


def test_the_run_says_what_an_outside_strategy_took_from_the_suite():
    from benchmarks.runner.building import settings_from_the_suite

    line = settings_from_the_suite(MINE, "synthetic", _resolved("smoke", [MINE])[MINE])
    assert line == (
        f"{MINE} on synthetic takes from the suite: epochs = 1 (its Config x epoch_scale 0.125), "
        "eval_batch_size = 500 ([defaults]), lora_rank = 8 ([defaults]), lora_alpha = 1.0 ([defaults]), "
        "train_augmentation = 'paper-scaled' ([common]); every other option is its Config's default"
    )
