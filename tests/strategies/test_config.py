"""``strategies.config``: the options every strategy shares, their defaults, and the one-line
refusal of an unknown option, a value of the wrong type or outside its choices or bounds."""

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Literal

import pytest

from benchmarks.core.errors import UserError
from strategies.config import StrategyConfig


@dataclass
class ModeConfig(StrategyConfig):
    """A strategy's own options: a choice, a number or ``"auto"``, and no training needed."""

    mode: Literal["fast", "exact"] = "fast"
    chunk: int | Literal["auto"] = "auto"
    min_epochs: ClassVar[int] = 0


@dataclass
class DerivedConfig(ModeConfig):
    depth: int = 2


def _refusal(**options) -> UserError:
    with pytest.raises(UserError) as error:
        StrategyConfig.from_dict(options, "finetune")
    return error.value


def test_defaults_are_the_shared_recipe():
    assert StrategyConfig().to_dict() == {
        "epochs": 1,
        "batch_size": 64,
        "eval_batch_size": 256,
        "lr": 0.005,
        "weight_decay": 0.1,
        "lora_rank": 24,
        "lora_alpha": 1.0,
        "prompt_template": "a photo of a {}.",
        "prompt_ensemble": "",
        "num_workers": 0,
        "train_augmentation": "paper",
        "optimizer": "adamw",
        "momentum": 0.0,
        "schedule": "cosine_iter",
        "warmup_steps": 0,
        "warmup_fraction": 0.0,
        "min_lr_ratio": 0.0,
        "grad_clip": 0.0,
        "amp": True,
    }


def test_a_config_round_trips_through_its_dict():
    config = StrategyConfig.from_dict({"epochs": 3, "optimizer": "sgd", "momentum": 0.9, "lr": 1})
    assert StrategyConfig.from_dict(config.to_dict()) == config
    assert config.lr == 1  # an integer is a number


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


def test_an_unknown_option_of_an_unnamed_strategy_names_its_config_class():
    with pytest.raises(
        UserError, match=r"^unknown option 'modes' \(did you mean 'mode'\?\) for strategy ModeConfig"
    ):
        ModeConfig.from_dict({"modes": "exact"})


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("lr", "0.1", "option lr = '0.1' of strategy finetune must be a number, not str"),
        ("epochs", 2.5, "option epochs = 2.5 of strategy finetune must be an integer, not float"),
        ("batch_size", True, "option batch_size = True of strategy finetune must be an integer, not bool"),
        ("amp", 1, "option amp = 1 of strategy finetune must be true or false, not int"),
        ("prompt_template", 3, "option prompt_template = 3 of strategy finetune must be a string, not int"),
    ],
)
def test_a_value_of_the_wrong_type_names_the_type_it_must_have(option, value, expected):
    error = _refusal(**{option: value})
    assert str(error) == expected and error.options == (option,)


@pytest.mark.parametrize(
    ("option", "value", "choices"),
    [
        ("optimizer", "lion", ["adamw", "adam", "sgd"]),
        ("schedule", "step", ["cosine_iter", "cosine_epoch", "coda_cosine"]),
        ("prompt_ensemble", "openai", ["", "cifar", "imagenet"]),
    ],
)
def test_a_value_outside_its_choices_lists_them(option, value, choices):
    error = _refusal(**{option: value})
    assert str(error) == f"option {option}={value!r} is not one of {choices}" and error.options == (option,)


def test_a_strategys_own_choice_fields_are_checked_too():
    assert ModeConfig.from_dict({"mode": "exact", "chunk": 8}).chunk == 8
    with pytest.raises(UserError) as error:
        DerivedConfig(mode="slow")  # inherited from ModeConfig
    assert str(error.value) == "option mode='slow' is not one of ['fast', 'exact']"
    with pytest.raises(UserError) as error:
        ModeConfig.from_dict({"chunk": "big"})
    assert str(error.value) == "option chunk='big' must be an integer or 'auto'"
    assert error.value.options == ("chunk",)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"warmup_steps": 2, "warmup_fraction": 0.1}, ("warmup_steps", "warmup_fraction")),
        ({"warmup_steps": -1}, ("warmup_steps",)),
        ({"warmup_fraction": 1.0}, ("warmup_fraction",)),
    ],
)
def test_warmup_is_steps_or_a_fraction_below_one_not_both(options, named):
    error = _refusal(**options)
    assert str(error) == "give warmup_steps >= 0 or warmup_fraction in [0, 1), not both"
    assert error.options == named


def test_the_cosine_floor_and_gradient_clip_are_bounded():
    error = _refusal(min_lr_ratio=1.5, grad_clip=-1.0)
    assert str(error) == "min_lr_ratio must be in [0, 1] and grad_clip >= 0"
    assert error.options == ("min_lr_ratio", "grad_clip")
    assert StrategyConfig(min_lr_ratio=1.0, grad_clip=0.0).min_lr_ratio == 1.0  # both ends allowed


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("batch_size", 0, "option batch_size = 0 must be at least 1"),
        ("eval_batch_size", 0, "option eval_batch_size = 0 must be at least 1"),
        ("lora_rank", 0, "option lora_rank = 0 must be at least 1"),
        ("num_workers", -1, "option num_workers = -1 must be at least 0"),
        ("momentum", -0.5, "option momentum = -0.5 must be at least 0"),
        (
            "epochs",
            0,
            "option epochs = 0 must be at least 1 (a strategy that trains nothing is continual_clip)",
        ),
        ("lr", 0, "option lr = 0 must be positive"),
        ("lr", -0.1, "option lr = -0.1 must be positive"),
    ],
)
def test_numbers_torch_would_reject_mid_run_are_refused_up_front(option, value, expected):
    error = _refusal(**{option: value})
    assert str(error) == expected and error.options == (option,)


def test_a_strategy_that_needs_no_training_may_set_zero_epochs():
    assert ModeConfig(epochs=0).epochs == 0
    with pytest.raises(UserError, match="^option epochs = -1 must be at least 0"):
        ModeConfig(epochs=-1)


@pytest.mark.parametrize(
    "options",
    [
        {"optimizer": "lion"},
        {"schedule": "step"},
        {"warmup_steps": 2, "warmup_fraction": 0.1},
        {"min_lr_ratio": 2.0},
        {"grad_clip": -1.0},
    ],
)
def test_bad_training_options_are_user_errors(options):
    with pytest.raises(UserError):
        StrategyConfig.from_dict(options)


def test_recipe_fields_are_those_declared_below_the_shared_config():
    assert StrategyConfig.recipe_fields() == frozenset()
    assert ModeConfig.recipe_fields() == {"mode", "chunk"}  # min_epochs is a ClassVar, no field
    assert DerivedConfig.recipe_fields() == {"mode", "chunk", "depth"}
