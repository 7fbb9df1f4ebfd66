"""The same numbers whatever the worker count and start method (``benchmarks.data.loaders``)."""

import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from benchmarks.data.datasets import load_dataset
from benchmarks.data.loaders import SeededSampler, SeededSamples, derive_seed, seed_words, seeded_loader
from benchmarks.data.streams import build_stream
from benchmarks.data.transforms import (
    TRAIN_AUGMENTATIONS,
    eval_transform,
    patch_shuffled_train_transform,
    train_transform,
)
from tests.helpers import kill_in_task, numbers_of_runs, result_of, run_suite_here, tiny_suite


@pytest.fixture(scope="module")
def faded_images():
    """40 faded synthetic training images (PIL) of 10 classes."""
    return load_dataset("synthetic", n_classes=10, n_train_per_class=4, n_test_per_class=1, domain="faded")


def _augmented(data, augmentation: str, size: int = 32):
    stream = build_stream(
        data, 1, list(range(10)), train_transform(size, augmentation=augmentation), eval_transform(size)
    )
    return stream.train_stream[0].dataset.train()


def _passes(loader, n: int = 2) -> list[list[torch.Tensor]]:
    return [[torch.cat([b[0].flatten(1), b[1][:, None].float()], 1) for b in loader] for _ in range(n)]


# --------------------------------------------------------------------------- seeds


@pytest.mark.slow
def test_seeds_are_stable_and_depend_on_every_part():
    # word i does not depend on how many words are drawn, so sample i's seed ignores the pass length
    assert np.array_equal(seed_words((0, 1, "augment"), 7)[:3], seed_words((0, 1, "augment"), 3))
    assert derive_seed(0, 1, "train") == derive_seed(0, 1, "train") < 2**63
    assert (
        len(
            {
                derive_seed(0, 1, "train"),
                derive_seed(1, 1, "train"),
                derive_seed(0, 2, "train"),
                derive_seed(0, 1, "eval"),
            }
        )
        == 4
    )
    # strings go through CRC-32, never Python's salted hash: the same value in a fresh interpreter
    code = "from benchmarks.data.loaders import derive_seed; print(derive_seed(3, 'compensation', -1))"
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(fresh.stdout) == derive_seed(3, "compensation", -1)


def test_a_pass_is_counted_when_it_draws_and_orders_come_from_key_and_pass():
    sampler = SeededSampler(10, (0, 0, "train"), shuffle=True)
    unused = iter(sampler)  # a DataLoader may make an iterator it never reads
    first, second = list(sampler), list(sampler)
    del unused
    assert sampler.passes == 2
    assert sorted(i for _, i in first) == list(range(10)) and first != second
    again = SeededSampler(10, (0, 0, "train"), shuffle=True)
    assert list(again) == first and list(again) == second  # a new loader repeats pass by pass
    # the seed of a sample depends on (key, pass, index), not on where the shuffle put it
    assert dict((i, s) for s, i in first) == dict(
        enumerate(seed_words((0, 0, "train", 0, "augment"), 10).tolist())
    )
    ordered = list(SeededSampler(4, (0, 0, "eval"), shuffle=False))
    assert [i for _, i in ordered] == [0, 1, 2, 3]


# --------------------------------------------------------------------------- one sample, any process


@pytest.mark.parametrize("augmentation", TRAIN_AUGMENTATIONS)
def test_every_augmentation_gives_a_sample_the_same_tensor_in_the_main_process_and_in_workers(
    faded_images, augmentation
):
    dataset = _augmented(faded_images, augmentation)
    key = (0, 0, "train")
    main = _passes(seeded_loader(dataset, key, 8, shuffle=True))
    workers = _passes(seeded_loader(dataset, key, 8, shuffle=True, num_workers=2, persistent_workers=True))
    assert all(torch.equal(a, b) for pa, pb in zip(main, workers) for a, b in zip(pa, pb))
    # a sample's augmentation is its seed's alone: recomputed directly, outside any loader
    seed, index = next(iter(SeededSampler(len(dataset), key, shuffle=True)))
    image, label, *_ = SeededSamples(dataset)[(seed, index)]
    assert torch.equal(main[0][0][0], torch.cat([image.flatten(), torch.tensor([float(label)])]))
    if augmentation != "none":  # two passes draw differently
        assert not torch.equal(torch.cat(main[0]), torch.cat(main[1]))


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_worker_under_fork_and_spawn_draws_what_the_main_process_draws(faded_images, method):
    dataset = _augmented(faded_images, "paper-scaled")
    key = (5, 2, "compensation")
    main = _passes(seeded_loader(dataset, key, 16, shuffle=True), 1)
    workers = _passes(
        seeded_loader(dataset, key, 16, shuffle=True, num_workers=1, multiprocessing_context=method), 1
    )
    assert all(torch.equal(a, b) for a, b in zip(main[0], workers[0]))


def test_the_global_generators_are_untouched_by_building_and_exhausting_a_loader(faded_images):
    dataset = _augmented(faded_images, "paper")
    after = []
    for workers in (0, 2):
        torch.manual_seed(123)
        before = torch.get_rng_state()
        for _ in range(2):
            _passes(seeded_loader(dataset, (0, 0, "train"), 8, shuffle=True, num_workers=workers), 2)
        assert torch.equal(torch.get_rng_state(), before)
        after.append(torch.rand(3))
    assert torch.equal(after[0], after[1])


def test_adaptervlms_patch_shuffled_augmentation_is_the_same_in_workers(faded_images):
    stream = build_stream(faded_images, 1, list(range(10)), eval_transform(32), eval_transform(32))
    shuffled = stream.train_stream[0].dataset.replace_current_transform_group(
        patch_shuffled_train_transform(32, augmentation="paper-scaled", grid=4)
    )
    main = _passes(seeded_loader(shuffled, (0, 0, "pseudo-ood"), 8, shuffle=True), 2)
    workers = _passes(seeded_loader(shuffled, (0, 0, "pseudo-ood"), 8, shuffle=True, num_workers=2), 2)
    assert all(torch.equal(a, b) for pa, pb in zip(main, workers) for a, b in zip(pa, pb))
    assert not torch.equal(
        torch.cat(main[0]), torch.cat(main[1])
    )  # the augmentation after the shuffle draws anew


class _NumpyJitter:
    def __call__(self, image):
        return eval_transform(32)(image) + float(np.random.rand())


def test_a_transform_drawing_from_numpy_is_named_once(faded_images, monkeypatch):
    monkeypatch.setattr(SeededSamples, "_warned", False)
    stream = build_stream(faded_images, 1, list(range(10)), _NumpyJitter(), eval_transform(32))
    dataset = stream.train_stream[0].dataset.train()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _passes(seeded_loader(dataset, (0, 0, "train"), 8, shuffle=True), 2)
    assert [str(w.message)[:30] for w in caught if w.category is RuntimeWarning] == [
        "a transform drew from Python's"
    ]


# --------------------------------------------------------------------------- whole runs

WORKERS_SUITE = (
    tiny_suite(["finetune", "gr4cil", "adaptervlm"])
    + """[dataset.synthetic]
n_classes = 20
n_train_per_class = 8
n_test_per_class = 4
domain = "faded"
train_augmentation = "paper-scaled"
[defaults]
batch_size = 16
eval_batch_size = 40
lora_rank = 2
lora_alpha = 2.0
epochs = 2
num_workers = {workers}
[strategy.gr4cil]
compensation_epochs = 2
threshold_holdout = 0.25
"""
)

RUN_IN_FRESH_PROCESS = (
    "import multiprocessing, sys, torch; multiprocessing.set_start_method(sys.argv[1]); "
    "torch.set_num_threads(1); from benchmarks import run; sys.exit(run.main(sys.argv[2:]))"
)


def _run_in_fresh_process(tmp_path, text: str, workers: int, method: str):
    """Run suite ``text`` with ``workers`` loader workers in a fresh Python process whose start
    method is ``method``; return its results folder."""
    suite = tmp_path / f"w{workers}-{method}.toml"
    suite.write_text(text.format(workers=workers))
    results = tmp_path / f"r{workers}-{method}"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            RUN_IN_FRESH_PROCESS,
            method,
            "--suite",
            str(suite),
            "--results-dir",
            str(results),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return results


@pytest.mark.slow
def test_a_suite_gives_identical_results_with_0_1_and_2_workers(tmp_path):
    """Under fork; spawn and forkserver are checked on a shorter run, where each spawned worker's
    import of Avalanche costs less in all (the start-method test below)."""
    found = {
        workers: numbers_of_runs(_run_in_fresh_process(tmp_path, WORKERS_SUITE, workers, "fork"))
        for workers in (1, 2)
    }
    # no loader worker, so no start method: run here (a fresh process would only import torch and
    # Avalanche again)
    found[0] = numbers_of_runs(run_suite_here(tmp_path, WORKERS_SUITE.format(workers=0))[1])
    assert sorted(found[0]) == ["adaptervlm", "finetune", "gr4cil"]
    assert found[1] == found[0] and found[2] == found[0]


@pytest.mark.slow
def test_a_run_killed_and_resumed_with_2_workers_equals_an_uninterrupted_run_with_none(tmp_path, monkeypatch):
    from benchmarks import run
    from strategies.methods.gr4cil import GR4CIL

    text = WORKERS_SUITE.replace('"finetune", "gr4cil", "adaptervlm"', '"gr4cil"')
    uninterrupted, resumed = tmp_path / "none.toml", tmp_path / "two.toml"
    uninterrupted.write_text(text.format(workers=0))
    resumed.write_text(text.format(workers=2))
    assert run.main(["--suite", str(uninterrupted), "--results-dir", str(tmp_path / "r0"), "--quiet"]) == 0
    revive = kill_in_task(monkeypatch, GR4CIL, task=3)
    argv = ["--suite", str(resumed), "--results-dir", str(tmp_path / "r2"), "--quiet"]
    assert run.main(argv) == 130
    revive()
    assert run.main(argv) == 0
    assert numbers_of_runs(tmp_path / "r2") == numbers_of_runs(tmp_path / "r0")


START_METHOD_SUITE = (
    tiny_suite(["gr4cil"], tasks=1, zero_shot_targets=["synthetic"])
    + """[dataset.synthetic]
n_classes = 10
n_train_per_class = 4
n_test_per_class = 2
[defaults]
batch_size = 8
eval_batch_size = 16
lora_rank = 2
lora_alpha = 2.0
num_workers = {workers}
[strategy.gr4cil]
epochs = 2
compensation_epochs = 2
threshold_holdout = 0.25
"""
)


@pytest.fixture(scope="module")
def without_workers(tmp_path_factory):
    # run here, as the 0-worker run above
    return run_suite_here(tmp_path_factory.mktemp("no-workers"), START_METHOD_SUITE.format(workers=0))[1]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_training_and_zero_shot_run_with_workers_under_every_start_method(tmp_path, method, without_workers):
    """Nothing that crosses to a worker may be a lambda or a local function (Python 3.14 makes
    forkserver Linux's default; macOS uses spawn); and the numbers are those of a run with no
    workers (``benchmarks.data.loaders``). One worker: every image is then loaded in a fresh
    process, which is what a start method changes; how the images are shared among workers is the
    fork test's (0, 1 and 2 workers, above). Each spawned worker imports Avalanche to unpickle its
    dataset (seconds on a CPU core), so a second worker would double this test's time for nothing."""
    results = _run_in_fresh_process(tmp_path, START_METHOD_SUITE, 1, method)
    result = result_of(results, "gr4cil")
    assert result["config"]["strategy_config"]["num_workers"] == 1
    assert result["zero_shot"]["synthetic"]["n_test"] == 100 * 20  # the target's whole test split
    assert numbers_of_runs(results) == numbers_of_runs(without_workers)
