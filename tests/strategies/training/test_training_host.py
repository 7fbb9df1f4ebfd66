"""``strategies.training.host``: every part of ``CLIPStrategy`` subclasses the one host Protocol,
which holds annotations only (it sits before Avalanche's ``SupervisedTemplate`` in the MRO, where a
method would hide Avalanche's), and every name it declares is there on a strategy once built."""

from avalanche.training.templates import SupervisedTemplate

from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
from strategies.base import CLIPStrategy
from strategies.methods.finetune import Finetune
from strategies.settings import RunSettings
from strategies.training.host import StrategyHost


def test_every_part_subclasses_the_host_and_the_host_has_no_method():
    parts = [cls for cls in CLIPStrategy.__mro__ if cls.__module__.startswith("strategies.training.")]
    assert len(parts) == 8 and all(StrategyHost in cls.__mro__ for cls in parts)  # 7 parts, the host
    mro = CLIPStrategy.__mro__
    assert mro.index(StrategyHost) < mro.index(SupervisedTemplate)
    assert not [name for name, value in vars(StrategyHost).items() if callable(value) and name[0] != "_"]
    assert "__init__" not in vars(StrategyHost)  # the parts' __init__ chain reaches Avalanche's


def test_every_name_the_host_declares_is_set_once_the_strategy_is_built():
    strategy = Finetune(
        backbone=create_clip(BackboneSpec(TINY_MODEL, None)),
        class_names=["cat", "dog"],
        config=Finetune.Config(),
        settings=RunSettings(show_progress=False),
    )
    assert not [name for name in vars(StrategyHost)["__annotations__"] if not hasattr(strategy, name)]
