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


@pytest.fixture(scope="module")
def tiny_stream():
    """20 synthetic classes in 2 tasks (8 training and 3 test images a class), 32-pixel eval transform."""
    from benchmarks.data.datasets import load_dataset
    from benchmarks.data.streams import build_stream
    from benchmarks.data.transforms import eval_transform

    data = load_dataset("synthetic", n_classes=20, n_train_per_class=8, n_test_per_class=3)
    transform = eval_transform(32)
    return build_stream(data, 2, list(range(20)), transform, transform)


@pytest.fixture(scope="module")
def small_data():
    """The 100 synthetic classes, 3 training and 2 test images a class."""
    from benchmarks.data.datasets import load_dataset

    return load_dataset("synthetic", None, n_train_per_class=3, n_test_per_class=2)


PERF = "tests/perf/"


def pytest_collection_modifyitems(config, items):
    """The hot-path timings (``tests/perf``) run only when asked for with
    ``--benchmark-only`` (or ``--benchmark-enable``); a plain ``pytest`` skips them."""
    if config.getoption("benchmark_only", False) or config.getoption("benchmark_enable", False):
        return
    skip = pytest.mark.skip(reason="a timing: run pytest tests/perf --benchmark-only")
    for item in items:
        if item.nodeid.startswith(PERF):
            item.add_marker(skip)
