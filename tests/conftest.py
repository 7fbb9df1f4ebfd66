"""Fixtures for every test; the helpers the tests import are in ``tests/helpers.py``."""

import pytest
import torch

from tests.helpers import MINI_SUITE, write_suite


@pytest.fixture(autouse=True, scope="session")
def _one_thread_per_test_process():
    # Small matmuls on 2 shared cores run faster on one thread than fighting over two.
    torch.set_num_threads(1)


@pytest.fixture
def mini_suite(tmp_path):
    """A 5-task, 100-class synthetic suite that runs in seconds."""
    return write_suite(tmp_path / "mini.toml", MINI_SUITE)


BENCHMARKS = "tests/benchmarks/"


def pytest_collection_modifyitems(config, items):
    """The hot-path benchmarks (``tests/benchmarks``) run only when asked for with
    ``--benchmark-only`` (or ``--benchmark-enable``); a plain ``pytest`` skips them."""
    if config.getoption("benchmark_only", False) or config.getoption("benchmark_enable", False):
        return
    skip = pytest.mark.skip(reason="a benchmark: run pytest tests/benchmarks --benchmark-only")
    for item in items:
        if item.nodeid.startswith(BENCHMARKS):
            item.add_marker(skip)
