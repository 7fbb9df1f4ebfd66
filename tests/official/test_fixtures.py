"""The golden fixtures match the generator's list of components, and each records its source."""

import re

from benchmarks.tools.official_goldens import components
from benchmarks.tools.official_goldens.golden import ROLES, fixture_components, load_golden


def test_every_registered_component_has_a_fixture_and_no_fixture_is_orphaned():
    assert fixture_components() == set(components())


def test_each_fixture_records_where_it_comes_from():
    for name, (official, _) in components().items():
        tensors, meta = load_golden(name)
        assert meta["component"] == name
        assert (meta["repository"], meta["commit"]) == (official.repository, official.commit)
        assert re.fullmatch(r"[0-9a-f]{40}", meta["commit"])
        assert meta["file"] and meta["function"] and meta["loading"]
        assert isinstance(meta["seed"], int) and meta["sizes"]
        assert tensors and all(key.split(".", 1)[0] in ROLES for key in tensors)
        assert any(key.startswith("output.") for key in tensors)
