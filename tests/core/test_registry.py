"""The registry helper's duplicate rule: one name, one definition, whatever a member is."""

import pytest

from benchmarks.core.registry import Registry


def first():
    pass


def second():
    pass


class Unit:
    pass


class OtherUnit:
    pass


def test_two_different_functions_under_one_name_are_refused():
    registry = Registry("benchmarks", "component")
    registry.add("probe", first)
    registry.add("probe", first)  # the same function again: a re-import, allowed
    with pytest.raises(ValueError, match="component name 'probe' is registered twice"):
        registry.add("probe", second)
    assert registry.members["probe"] is first


def test_instances_are_the_same_member_when_their_class_is():
    registry = Registry("benchmarks", "dataset")
    registry.add("probe", Unit())
    registry.add("probe", Unit())
    with pytest.raises(ValueError, match="dataset name 'probe' is registered twice"):
        registry.add("probe", OtherUnit())


def test_a_module_imported_twice_replaces_its_members():
    """A re-import defines new objects under the same qualified names: the same members."""
    namespace: dict = {"__name__": __name__}
    exec("class Unit:\n    pass\n\ndef first():\n    pass\n", namespace)
    registry = Registry("benchmarks", "member")
    registry.add("class", Unit)
    registry.add("class", namespace["Unit"])
    registry.add("function", first)
    registry.add("function", namespace["first"])
    assert registry.members == {"class": namespace["Unit"], "function": namespace["first"]}


def test_records_are_compared_by_what_defined_by_names():
    registry = Registry("benchmarks", "component", defined_by=lambda record: record[1])
    registry.add("probe", ("official", first))
    with pytest.raises(ValueError, match="registered twice"):
        registry.add("probe", ("official", second))
