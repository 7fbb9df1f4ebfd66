"""A strategy's run settings (``strategies.settings``): one object, resolved before the strategy
sees it; a strategy built directly gets the CPU in its config's precision there; a setting given
as its own keyword is refused in one line, not passed on to Avalanche."""

import dataclasses

import pytest
import torch

from benchmarks.core.errors import UserError
from strategies.methods.finetune import Finetune
from strategies.methods.gr4cil import GR4CIL
from strategies.settings import RunSettings


@pytest.fixture(scope="module")
def backbone():
    from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip

    torch.manual_seed(0)
    return create_clip(BackboneSpec(TINY_MODEL, "synthetic"))


CLASSES = [f"class {k}" for k in range(4)]


def test_auto_resolves_with_the_configs_amp_and_the_device():
    amp, no_amp = Finetune.Config(amp=True), Finetune.Config(amp=False)
    assert RunSettings.resolved(amp).precision == "fp32"  # the CPU
    assert RunSettings.resolved(amp, device="cuda").precision == "fp16"
    assert RunSettings.resolved(no_amp, device="cuda").precision == "fp32"
    assert RunSettings.resolved(amp, precision="bf16", device="cuda").precision == "bf16"


def test_an_unresolved_precision_is_refused_in_one_line():
    with pytest.raises(UserError, match=r"RunSettings\(precision='auto'\).*RunSettings.resolved"):
        RunSettings(precision="auto")


def test_a_strategy_built_directly_runs_on_the_cpu_in_fp32_with_its_settings_kept(backbone):
    strategy = Finetune(backbone=backbone, class_names=CLASSES, config=Finetune.Config())
    assert strategy.device == torch.device("cpu")
    assert (strategy.settings.precision, strategy.settings.train_batches) == ("fp32", None)
    assert strategy.settings == RunSettings.resolved(Finetune.Config())
    assert strategy.settings.seed == torch.initial_seed()
    # read whole: no setting is copied into an attribute of its own that could drift from it
    copies = ("precision", "show_progress", "seed", "train_batches", "augment_on")
    assert not [name for name in copies if name in vars(strategy)]

    given = RunSettings(show_progress=False, seed=7, train_batches=3, augment_on="pil")
    strategy = Finetune(backbone=backbone, class_names=CLASSES, config=Finetune.Config(), settings=given)
    assert strategy.settings is given
    assert not [name for name in ("precision", "show_progress", "seed") if name in vars(strategy)]


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(RunSettings)])
def test_every_setting_given_as_its_own_keyword_is_refused_naming_run_settings(backbone, field):
    """Before Avalanche's check of unknown keywords, which cannot know ``RunSettings``."""
    with pytest.raises(TypeError) as err:
        Finetune(backbone=backbone, class_names=CLASSES, config=Finetune.Config(), **{field: None})
    assert str(err.value) == (
        f"Finetune: give {field} in settings=RunSettings({field}=...) (strategies.settings)"
    )


def test_several_settings_are_named_together_and_a_misspelt_keyword_is_avalanches(backbone):
    with pytest.raises(TypeError) as err:
        GR4CIL(backbone=backbone, class_names=CLASSES, config=GR4CIL.Config(), seed=0, show_progress=False)
    assert str(err.value) == (
        "GR4CIL: give show_progress, seed in settings=RunSettings(show_progress=..., seed=...) "
        "(strategies.settings)"
    )
    with pytest.raises(TypeError, match="unexpected keyword argument: evaluater"):
        Finetune(backbone=backbone, class_names=CLASSES, config=Finetune.Config(), evaluater=None)
