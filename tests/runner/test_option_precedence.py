"""Strategy options resolve from the most specific table to the most general: a variant's table,
then ``[strategy.NAME]``, then ``[defaults]``, then ``[dataset.NAME]``, then the strategy's own
default; each run's config records the value and where it came from."""

import pytest

from benchmarks.runner.building import resolve
from benchmarks.runner.suites import expand, load_suite
from tests.helpers import tiny_suite

BASE = tiny_suite(["l2p_pp", "plain"])
VARIANT = '[variants.plain]\nstrategy = "l2p_pp"\n'
BASE += VARIANT


def _resolved(tmp_path, tables: str, variant: bool = True) -> dict[str, tuple]:
    """label -> (train_augmentation, its source, batch_size, its source) of each run; ``variant``
    False leaves the base's empty variant table out (``tables`` has its own)."""
    path = tmp_path / "suite.toml"
    path.write_text((BASE if variant else BASE.replace(VARIANT, "")) + tables)
    out = {}
    for spec in expand(load_suite(str(path))):
        resolved = resolve(spec, "data")
        strategy_cfg, config = resolved.strategy_cfg, resolved.config
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
    from benchmarks.runner.result_record import config_hash

    path = tmp_path / "a.toml"
    path.write_text(BASE + "[defaults]\nbatch_size = 16\n")
    from_defaults = resolve(expand(load_suite(str(path)))[0], "data").config
    assert config_hash(from_defaults) == config_hash({**from_defaults, "option_sources": {}})


def test_a_bad_value_names_where_it_was_set(tmp_path):
    from benchmarks.core.errors import UserError

    path = tmp_path / "bad.toml"
    path.write_text(BASE + '[dataset.synthetic]\ntrain_augmentation = "jitter"\n')
    with pytest.raises(UserError, match=r"train_augmentation='jitter'.*\[dataset.synthetic\]"):
        resolve(expand(load_suite(str(path)))[0], "data")


OUTSIDE = "strategies.methods.finetune:Finetune"  # a strategy named as module:Class, as one from outside is


def test_an_option_typo_suggests_the_option_and_names_only_its_table_quoted(tmp_path, capsys):
    """The valid options the line lists include [defaults]' batch_size: that table is not named."""
    import dataclasses

    from benchmarks import run
    from strategies.methods.finetune import Finetune

    path = tmp_path / "typo.toml"
    path.write_text(
        BASE.replace('["l2p_pp", "plain"]', f'["{OUTSIDE}"]').replace(VARIANT, "")
        + f'[defaults]\nbatch_size = 16\n[strategy."{OUTSIDE}"]\nepocs = 3\n'
    )
    assert run.main(["--suite", str(path), "--results-dir", str(tmp_path / "r"), "--dry-run"]) == 2
    valid = sorted(f.name for f in dataclasses.fields(Finetune.Config))
    assert capsys.readouterr().err.splitlines() == [
        f"error: unknown option 'epocs' (did you mean 'epochs'?) for strategy {OUTSIDE}; valid options: "
        f'{valid} (set in [strategy."{OUTSIDE}"])'
    ]


def test_a_strategys_own_check_names_the_table_of_the_option_it_names(tmp_path):
    from benchmarks.core.errors import UserError

    path = tmp_path / "bad.toml"
    path.write_text(BASE + "[defaults]\nbatch_size = 16\n[strategy.l2p_pp]\nprompt_length = 3\n")
    with pytest.raises(UserError) as error:
        resolve(expand(load_suite(str(path)))[0], "data")
    assert str(error.value) == (
        "l2p_pp option prompt_length=3 must be even (keys + values) (set in [strategy.l2p_pp])"
    )


def test_suite_tables_are_named_as_the_toml_spells_them():
    from benchmarks.runner.building import suite_table

    assert [
        suite_table(source)
        for source in (
            "defaults",
            "dataset.synthetic",
            "strategy.gr4cil",
            "variants.gr4cil-base",
            "variants.gr4cil-b0.1-g0.1",
            f"strategy.{OUTSIDE}",
            "protocol.as-published.clap",
        )
    ] == [
        "[defaults]",
        "[dataset.synthetic]",
        "[strategy.gr4cil]",
        "[variants.gr4cil-base]",
        '[variants."gr4cil-b0.1-g0.1"]',
        f'[strategy."{OUTSIDE}"]',
        'protocol = "as-published"',
    ]


def test_a_variant_of_an_outside_strategy_takes_its_own_and_its_strategys_options(tmp_path, monkeypatch):
    """docs/running.md: ``[variants.X] strategy = "module:Class"`` with options of its own."""
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "my_strategy"
    monkeypatch.syspath_prepend(str(example))  # the example from outside the repository, installed nowhere
    mine = "my_strategy.strategy:MyStrategy"
    path = tmp_path / "variant.toml"
    path.write_text(
        BASE.replace('["l2p_pp", "plain"]', '["mine-long"]').replace(VARIANT, "")
        + f'[strategy."{mine}"]\nlr = 0.001\nepochs = 2\n'
        + f'[variants.mine-long]\nstrategy = "{mine}"\nepochs = 10\n'
    )
    (spec,) = expand(load_suite(str(path)))
    assert (spec.label, spec.strategy, str(spec.key.relpath)) == (
        "mine-long",
        mine,
        "synthetic/mine-long/T5-seed0",
    )
    resolved = resolve(spec, "data")
    strategy_cls, strategy_cfg, config = resolved.strategy_cls, resolved.strategy_cfg, resolved.config
    assert f"{strategy_cls.__module__}:{strategy_cls.__name__}" == mine
    assert (strategy_cfg.epochs, strategy_cfg.lr, strategy_cfg.lora_rank) == (10, 0.001, 8)
    sources = config["option_sources"]
    assert (sources["epochs"], sources["lr"], sources["lora_rank"]) == (
        "variants.mine-long",
        f"strategy.{mine}",
        "default",
    )
    assert (config["label"], config["strategy"]) == ("mine-long", mine)
