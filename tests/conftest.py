"""Fixtures for every test; the helpers the tests import are in ``tests/helpers.py``.

The tests run in parallel with pytest-xdist (``-n auto --dist loadgroup``, pyproject.toml's
addopts): a test module runs whole on one worker (its module-scoped fixtures are built once), except
a module marked ``spread``, whose tests share only session fixtures and go to any worker. The costly
inputs (fake data in the real formats with a random ViT-B/16 weight file, a random ViT-B/16, the
smoke suite's results) are built once per test run, whatever the number of workers
(``built_once``). ``pytest -n 0`` or ``pytest -p no:xdist`` runs everything in this one process.
"""

import copy
import os
import shutil
from pathlib import Path

import pytest
import torch

from tests.helpers import MINI_SUITE, write_suite

GIB = 2**30
# The most memory one worker takes in the full run (measured 3.6 GiB: ViT-B/16 fast dev runs; 2.3 GiB
# in the fast tier): -n auto starts no more workers than the available memory holds.
WORKER_MEMORY = 4 * GIB


def pytest_addoption(parser, pluginmanager):
    """Without pytest-xdist (``-p no:xdist``, or the test extras not installed), accept its options
    from pyproject.toml's addopts and ignore them: the tests run in this one process."""
    if not pluginmanager.has_plugin("xdist"):
        group = parser.getgroup("xdist", "pytest-xdist is not loaded: these are ignored")
        group._addoption("-n", "--numprocesses", dest="numprocesses", default=None)
        group._addoption("--dist", dest="dist", default="no")
        group._addoption("--no-loadscope-reorder", dest="loadscopereorder", action="store_false")


def pytest_configure(config):
    if not config.pluginmanager.has_plugin("xdist"):  # the marks set below mean nothing then
        config.addinivalue_line("markers", "xdist_group(name): pytest-xdist's; ignored without it")


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: unknown without it
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per usable CPU (each test process uses one torch thread), but no more
    than the available memory holds at ``WORKER_MEMORY`` a worker. PYTEST_XDIST_AUTO_NUM_WORKERS
    sets the number."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cpus, _available_memory() // WORKER_MEMORY))


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as info:
            fields = dict(line.split(":", 1) for line in info)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return 1 << 62  # unknown: the CPUs decide


@pytest.hookimpl(wrapper=True)  # before xdist's own: it reads numprocesses
def pytest_cmdline_main(config):
    """Timings (``--benchmark-only`` or ``--benchmark-enable``) run alone, in this one process; any
    other run under xdist disables pytest-benchmark quietly (its timings are skipped anyway)."""
    if config.getoption("benchmark_only", False) or config.getoption("benchmark_enable", False):
        if not hasattr(config, "workerinput"):
            config.option.numprocesses, config.option.dist = 0, "no"
    elif config.getoption("dist", "no") != "no" or os.environ.get("PYTEST_XDIST_WORKER"):
        config.option.benchmark_disable = True
    return (yield)


# The modules that take longest (pytest's --durations) go first, so that the rest fills in beside them:
# the groups that run whole on one worker (a late one of a minute or more ends the run alone), then the
# spread modules of long single tests; the short tests fill in last.
FIRST = (
    "tests/runner/test_smoke_suite.py",  # 5 minutes where the README command's results are not this commit's
    "tests/data/test_seeded_loading.py",  # one group of about 3 minutes
    "tests/runner/test_slurm_real.py",  # one group of about 2 minutes
    "tests/runner/test_wide_backbones.py",  # ViT-L/14 and ViT-B/32 at random: a minute a case
    "tests/runner/test_real_path_walk.py",
    "tests/runner/test_runner.py",
    "tests/runner/test_locks_and_workers.py",  # local launchers: half a minute a case
    "tests/miniature/test_clap_diagnosis.py",
    "tests/tools/test_shared_cores.py",
    "tests/tools/test_kill_rerun.py",
    "tests/data/test_units_ptm.py",  # each unit's 12 strategies end to end
    "tests/data/test_units_fine_grained.py",
    "tests/strategies/test_no_silent_no_op.py",
    "tests/runner/test_locking_and_status.py",
)


def _rank(item) -> int:
    return next((rank for rank, module in enumerate(FIRST) if item.nodeid.startswith(module)), len(FIRST))


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """Each test module is one xdist group unless it is marked ``spread``; the longest modules
    first. The hot-path timings (``tests/perf``) run only when asked for with ``--benchmark-only``
    (or ``--benchmark-enable``); a plain ``pytest`` skips them."""
    for item in items:
        if not item.get_closest_marker("spread") and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    items.sort(key=_rank)  # stable: the rest keep their order
    if config.getoption("benchmark_only", False) or config.getoption("benchmark_enable", False):
        return
    skip = pytest.mark.skip(reason="a timing: run pytest tests/perf --benchmark-only")
    for item in items:
        if item.nodeid.startswith(PERF):
            item.add_marker(skip)


PERF = "tests/perf/"


def built_once(tmp_path_factory, name: str, build) -> Path:
    """The folder ``name``, filled by ``build(folder)`` once per test run: under xdist by the first
    worker to ask, under a file lock in the run's shared temporary folder, and then read by every
    worker; without xdist, once in this process. A test must not change what is in it."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        folder = tmp_path_factory.mktemp(name, numbered=False)
        build(folder)
        return folder
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent  # the run's folder, above each worker's own
    folder, done = shared / name, shared / f"{name}.done"
    with FileLock(str(shared / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a build that failed in another worker
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


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


@pytest.fixture(scope="session")
def fake_root(tmp_path_factory) -> Path:
    """``python -m benchmarks.tools.fake_data``'s output with its defaults: every real dataset in
    its real layout (2 training and 1 test image a class, seed 0) and a randomly initialised
    ViT-B-16-quickgelu weight file (``fake_data.WEIGHTS_FILE``). Read only."""
    from benchmarks.tools.fake_data import make_fake_data

    return built_once(tmp_path_factory, "fake-data", make_fake_data)


@pytest.fixture(scope="session")
def _vit_b16_template():
    from benchmarks.backbone import BackboneSpec, create_clip

    return create_clip(BackboneSpec("ViT-B-16-quickgelu", None))


@pytest.fixture
def vit_b16(_vit_b16_template):
    """A fresh, randomly initialised ViT-B-16-quickgelu backbone as ``create_clip`` builds it
    (attention split, base weights frozen, no adapters): a copy of one built once per worker."""
    return copy.deepcopy(_vit_b16_template)


README_RESULTS = Path(__file__).parents[1] / "runs" / "smoke"  # where the README's first command writes


def _results_of_this_commit(folder: Path) -> bool:
    """``folder`` holds the smoke suite's results computed from the checked-out commit with no
    change to a tracked file and the README command's thread count, and the tree has no change
    now: then they are this code's results."""
    from benchmarks.core.environment import auto_threads, environment
    from benchmarks.runner.reading import iter_results

    env = environment("cpu", "auto")
    found = [r for _, r in iter_results(folder)] if folder.is_dir() else []
    return (
        bool(found)
        and env["git_dirty"] is False
        and all(
            r["env"].get("git_commit") == env["git_commit"]
            and r["env"].get("git_dirty") is False
            # the README command's threads (--threads auto): CPU float sums depend on the count
            and r["env"].get("threads_setting") == "auto"
            and r["env"].get("torch_threads") == auto_threads("cpu")
            for r in found
        )
    )


def _run_smoke(results: Path) -> None:
    from benchmarks import run

    # CI runs the README's first command before the tests: its results, from this very commit, are
    # this run's (the runner skips a finished run with the same config, as it does for any user).
    if _results_of_this_commit(README_RESULTS):
        shutil.copytree(README_RESULTS, results, dirs_exist_ok=True)
    # the README command's options: the run sets its threads as that command does (--threads auto)
    assert run.main(["--suite", "smoke", "--results-dir", str(results), "--quiet"]) == 0


@pytest.fixture(scope="session")
def smoke_results(tmp_path_factory):
    """The shipped ``smoke`` suite run as the README's first command runs it (reusing that
    command's results where they are this commit's): the results folder and each run's result by
    label. Read only."""
    from benchmarks.runner.reading import iter_results

    results = built_once(tmp_path_factory, "smoke", _run_smoke)
    return results, {r["label"]: r for _, r in iter_results(results)}
