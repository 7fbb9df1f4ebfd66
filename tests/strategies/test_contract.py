"""The runner's contract (strategies/contract.py): its tables are the docs' tables, every registered
strategy meets it, and a class that does not is one line naming what it lacks and how to wrap it."""

import re
from pathlib import Path

import pytest

from benchmarks.core.errors import UserError
from strategies import contract
from strategies.base import CLIPStrategy
from strategies.registry import available, get_strategy

DOC = (Path(__file__).resolve().parents[2] / "docs" / "adding-a-strategy.md").read_text()


def _table(heading: str) -> dict[str, list[str]]:
    """First-column name -> the other cells, of the table under ``heading``."""
    start = DOC.index(heading + "\n")
    following = re.search(r"^#{2,3} ", DOC[start + len(heading) :], re.M)
    section = DOC[start : start + len(heading) + (following.start() if following else len(DOC))]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| `")]
    return {row[0].strip().strip("`"): [cell.strip() for cell in row[1:]] for row in rows}


def test_the_docs_tables_are_the_contract():
    assert {k: v[0] for k, v in _table("### Required").items()} == contract.REQUIRED
    assert {k: tuple(v) for k, v in _table("### Optional").items()} == {
        k: (member.what, member.without, contract.shown_default(member.default))
        for k, member in contract.OPTIONAL.items()
    }
    assert {
        k: v[0] for k, v in _table("### What the runner passes").items()
    } == contract.CONSTRUCTOR_ARGUMENTS


def test_the_protocol_names_the_required_members():
    declared = {name for name in vars(contract.Strategy) if not name.startswith("_")}
    declared |= set(contract.Strategy.__annotations__)
    assert declared == set(contract.REQUIRED)


def test_the_docs_optional_table_is_the_one_the_contract_writes():
    table = contract.optional_table()
    assert table.count("\n") == len(contract.OPTIONAL) + 1  # the header, its rule, one row a member
    assert table in DOC, (
        "regenerate it: python -c 'from strategies.contract import optional_table as t; print(t())'"
    )


def test_a_missing_optional_member_reads_as_its_default_and_a_present_one_as_itself():
    class Bare:
        pass

    class Own:
        skipped_steps = 3

        @property
        def train_iterations(self) -> int:
            return 7

    for name, member in contract.OPTIONAL.items():
        assert getattr(contract.OptionalMembers(Bare()), name) is member.default
        assert member.name == name
    assert contract.OptionalMembers(Own()).skipped_steps == 3
    assert contract.OptionalMembers(Own()).train_iterations == 7  # a property reads as its value
    assert contract.OptionalMembers(Own).skipped_steps == 3  # a class attribute, read on the class
    assert contract.OptionalMembers(Bare).stage_diagnostics(None, None, {}) == {}
    assert contract.OptionalMembers(Bare).run_diagnostics() == {}
    assert contract.OptionalMembers(Bare).trainable_parameter_count() is None
    assert contract.OptionalMembers(Bare).resume_refusal({}) is None
    # a name outside the contract is no member, not a default
    assert not hasattr(contract.OptionalMembers(Bare()), "learn_faster")


@pytest.mark.parametrize("name", available())
def test_every_registered_strategy_meets_the_contract(name):
    cls = get_strategy(name)
    assert contract.missing(cls) == []
    assert issubclass(cls, CLIPStrategy) and cls.finishes_pending_images


def _one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


def test_an_avalanche_strategy_named_as_a_class_says_how_to_wrap_it():
    with pytest.raises(UserError) as err:
        get_strategy("avalanche.training:LwF")
    assert _one_line(err) == (
        "avalanche.training:LwF is not a strategy of this suite: it lacks learn, scores, seen_classes, "
        "checkpoint_state and load_checkpoint_state; wrap it as avalanche:LwF (an Avalanche strategy on "
        "a head over CLIP features) (docs/adding-a-strategy.md)"
    )


MODULE = """
class Learner:  # PyCIL's shape
    def incremental_train(self, data_manager): ...
    def after_task(self): ...

class Model:  # Mammoth's shape
    def observe(self, inputs, labels, not_aug_inputs): ...

class Nothing:
    pass

class HalfStrategy:
    seen_classes = []
    def learn(self, experience): ...
    def scores(self, images): ...

class NoKeywords:
    def __init__(self, backbone, config):
        self.seen_classes = []
    def learn(self, experience): ...
    def scores(self, images): ...
    def checkpoint_state(self): ...
    def load_checkpoint_state(self, tensors, meta): ...

class Minimal(NoKeywords):
    def __init__(self, **runner_arguments):
        self.seen_classes = []

not_a_class = 3
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "user_strategies.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "user_strategies"


@pytest.mark.parametrize(
    "attr, says",
    [
        (
            "Learner",
            "it lacks learn, scores, seen_classes, checkpoint_state and load_checkpoint_state; "
            "wrap it as pycil:user_strategies:Learner (a PyCIL/PILOT/C3Box learner)",
        ),
        ("Model", "wrap it as mammoth:user_strategies:Model (a Mammoth model)"),
        ("Nothing", "subclass strategies.base.CLIPStrategy, or wrap it as avalanche:MODULE:CLASS"),
        ("HalfStrategy", "it lacks checkpoint_state and load_checkpoint_state;"),
        (
            "NoKeywords",
            "constructor does not take the runner's keyword argument(s) class_names, settings, plugins",
        ),
        ("not_a_class", "user_strategies:not_a_class is a int, not a class"),
    ],
)
def test_what_is_not_a_strategy_is_one_line_naming_what_it_lacks(user_module, attr, says):
    with pytest.raises(UserError) as err:
        get_strategy(f"{user_module}:{attr}")
    assert says in _one_line(err)


def test_the_required_core_is_enough(user_module):
    cls = get_strategy(f"{user_module}:Minimal")
    assert contract.missing(cls) == [] and contract.config_class(cls).__name__ == "StrategyConfig"


@pytest.mark.parametrize(
    "name, says",
    [
        ("avalanche:NoSuchStrategy", "module 'avalanche.training'"),
        ("pycil:NoColon", "give it as pycil:module.path:ClassName"),
        ("avalanche:torch.nn:Linear", "is not an Avalanche SupervisedTemplate subclass"),
    ],
)
def test_a_framework_name_that_does_not_resolve_is_one_line(name, says):
    with pytest.raises(UserError) as err:
        get_strategy(name)
    assert says in _one_line(err)
