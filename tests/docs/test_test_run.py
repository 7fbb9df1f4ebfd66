"""The test run itself: under pytest-xdist (pyproject.toml's addopts), a module runs whole on one
worker unless marked ``spread`` (tests/conftest.py). Module fixtures are built once that way, and a
test may rely on what ran before it in its module."""

import os

import pytest


def test_this_module_is_one_xdist_group(request):
    """xdist 3.8 with pytest 9.2 dropped every group without a word (pytest-dev/pytest-xdist#1386):
    CI then split modules over workers. This fails instead, wherever the groups are lost."""
    # a worker's own config says loadgroup here (xdist's remote.setup_config), not in --dist
    if not os.environ.get("PYTEST_XDIST_WORKER") or not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not under pytest-xdist's --dist loadgroup")
    assert request.node.nodeid.endswith("@tests/docs/test_test_run.py"), request.node.nodeid
