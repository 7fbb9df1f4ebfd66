"""Strategy options resolve from the most specific table to the most general: a variant's table,
then ``[strategy.NAME]``, then ``[defaults]``, then ``[dataset.NAME]``, then the strategy's own
default; each run's config records the value and where it came from."""

import pytest

from benchmarks.runner.execute import resolve
from benchmarks.runner.suites import expand, load_suite

BASE = """
datasets = ["synthetic"]
tasks = [5]
seeds = [0]
strategies = ["l2p_pp", "plain"]
device = "cpu"
[backbone]
model = "tiny-clip-32"
pretrained = "synthetic"
"""
VARIANT = '[variants.plain]\nstrategy = "l2p_pp"\n'
BASE += VARIANT


def _resolved(tmp_path, tables: str, variant: bool = True) -> dict[str, tuple]:
    """label -> (train_augmentation, its source, batch_size, its source) of each run; ``variant``
    False leaves the base's empty variant table out (``tables`` has its own)."""
    path = tmp_path / "suite.toml"
    path.write_text((BASE if variant else BASE.replace(VARIANT, "")) + tables)
    out = {}
    for spec in expand(load_suite(str(path))):
        _, strategy_cfg, config = resolve(spec, "data")
        assert config["strategy_config"]["train_augmentation"] == strategy_cfg.train_augmentation
        sources = config["option_sources"]
        out[spec.label] = (
            strategy_cfg.train_augmentation,
            sources["train_augmentation"],
            strategy_cfg.batch_size,
            sources["batch_size"],
        )
    return out


def test_the_strategys_own_default_when_nothing_is_set(tmp_path):
    assert _resolved(tmp_path, "")["l2p_pp"] == ("rrc_flip", "default", 128, "default")


def test_a_dataset_table_beats_the_strategys_default(tmp_path):
    found = _resolved(tmp_path, '[dataset.synthetic]\ntrain_augmentation = "flip"\n')
    assert found["l2p_pp"][:2] == ("flip", "dataset.synthetic")


def test_defaults_beat_the_dataset_table(tmp_path):
    found = _resolved(
        tmp_path,
        '[dataset.synthetic]\ntrain_augmentation = "flip"\n'
        '[defaults]\ntrain_augmentation = "none"\nbatch_size = 16\n',
    )
    assert found["l2p_pp"] == ("none", "defaults", 16, "defaults")


LAYERED = (
    '[dataset.synthetic]\ntrain_augmentation = "flip"\n'
    '[defaults]\ntrain_augmentation = "none"\nbatch_size = 16\n'
    '[strategy.l2p_pp]\ntrain_augmentation = "rrc90"\nbatch_size = 32\n'
)


def test_a_strategy_table_beats_defaults(tmp_path):
    found = _resolved(tmp_path, LAYERED)
    assert found["l2p_pp"] == ("rrc90", "strategy.l2p_pp", 32, "strategy.l2p_pp")
    assert found["plain"] == found["l2p_pp"]  # a variant that sets nothing inherits its strategy's table


def test_a_variant_beats_its_strategys_table(tmp_path):
    found = _resolved(tmp_path, LAYERED + VARIANT + 'train_augmentation = "paper"\n', variant=False)
    assert found["plain"] == ("paper", "variants.plain", 32, "strategy.l2p_pp")
    assert found["l2p_pp"][:2] == ("rrc90", "strategy.l2p_pp")


def test_the_sources_do_not_change_a_runs_identity(tmp_path):
    """Where a value came from is a record, not a cause: the same resolved values hash alike."""
    from benchmarks.runner.results import config_hash

    path = tmp_path / "a.toml"
    path.write_text(BASE + "[defaults]\nbatch_size = 16\n")
    _, _, from_defaults = resolve(expand(load_suite(str(path)))[0], "data")
    assert config_hash(from_defaults) == config_hash({**from_defaults, "option_sources": {}})


def test_a_bad_value_names_where_it_was_set(tmp_path):
    from benchmarks.core.errors import UserError

    path = tmp_path / "bad.toml"
    path.write_text(BASE + '[dataset.synthetic]\ntrain_augmentation = "jitter"\n')
    with pytest.raises(UserError, match=r"train_augmentation='jitter'.*\[dataset.synthetic\]"):
        resolve(expand(load_suite(str(path)))[0], "data")
