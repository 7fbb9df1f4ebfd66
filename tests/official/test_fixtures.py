"""The golden fixtures match the generator's list of components, and each records its source."""

import re

from tests.official.goldens import components
from tests.official.goldens.golden import ROLES, fixture_components, load_golden


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


def test_the_docs_table_lists_every_component_at_its_pinned_commit():
    """docs/baselines.md §16 (and REPRODUCIBILITY.md's column, built from it) cannot go stale."""
    from analysis.reproducibility import _equality_cell, _loop_cell, official_equality

    rows = official_equality()
    registry = components()
    assert sorted(row["component"] for row in rows) == sorted(registry)
    for row in rows:
        official = registry[row["component"]][0]
        assert row["official"].startswith(f"{official.repository}@{official.commit[:7]} ")
        assert row["verdict"] == "equal" or row["verdict"].startswith("differs"), row
        assert row["strategies"] and row["max_diff"] >= 0
    cell = _equality_cell("magmax", rows)
    magmax = [row for row in rows if "magmax" in row["strategies"] and not row["component"].endswith(".loop")]
    assert cell.startswith(f"{len(magmax)} of {len(magmax)} components equal")
    # the eight baselines whose official code trains have their loop beside it, sized (issue 52)
    looped = ("l2p_pp", "dualprompt", "coda_prompt", "magmax", "mg_clip", "moe4cl", "aper_adapter", "clap")
    for name in looped:
        cell = _loop_cell(name, rows)
        assert re.fullmatch(r"equal \(\d+ tasks? x \d+ steps, max diff [\d.e+-]+\)", cell), name


def test_the_generator_says_in_one_line_what_is_missing(tmp_path, capsys):
    from tests.official.goldens.__main__ import main

    assert main(["--components", "magmax.merge"]) == 2
    assert main(["--official-root", str(tmp_path), "--components", "no.such"]) == 2
    assert main(["--official-root", str(tmp_path), "--components", "magmax.merge"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("error: ") for line in lines)
    assert "--official-root" in lines[0] and "no.such" in lines[1]
    assert "git clone https://github.com/danielm1405/magmax" in lines[2] and "checkout 4f49f18" in lines[2]
    assert not any((tmp_path / "out").glob("*"))


def test_the_generator_lists_its_components_with_their_sources(capsys):
    from tests.official.goldens.__main__ import main

    assert main(["--list"]) == 0
    listed = [line.split("\t") for line in capsys.readouterr().out.strip().splitlines()]
    assert [row[0] for row in listed] == sorted(components())
    assert all("@" in row[1] for row in listed)
