"""Data loaders whose every random draw depends only on what it is for.

A run's numbers must not depend on how many workers load its data, on the start method (fork,
forkserver, spawn) or on a resume. Two rules make it so:

* **Each sample's augmentation has its own seed**, derived from (loader key, pass, sample index).
  The sampler, which always runs in the main process, sends the seed with the index;
  ``SeededSamples`` seeds torch's default generator with it around that one sample, in whichever
  process transforms it, and restores the generator after. Every torchvision transform draws from
  that generator, so sample *i* of pass *e* gets the same crop, flip and rotation everywhere.
* **A loader never draws from the global generator.** Its shuffle comes from a generator seeded
  by (key, pass), and its workers' base seed from one seeded by its key. Initialisations and
  dropout then see the same global stream whatever the worker count.

The key names the loader; strategies use (run seed, task, purpose). A loader counts its own
passes (epochs): pass *e* is the *e*-th iterator that yields a batch.

A transform that leaves its pixels to the device (``benchmarks.data.device_augment``) yields
``DevicePending`` items; a loader given the run's ``device`` finishes them there, batch by batch
(``DeviceBatches``), after the same per-sample draws.

Draws from Python's ``random`` or numpy's global generator are not seeded per sample (doing so
costs more than the transform: about 30 us and 200 us a sample). ``SeededSamples`` checks the
first sample it loads in each process and warns once if the transform drew from either.
"""

from __future__ import annotations

import itertools
import random
import warnings
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler

from benchmarks.data.device_augment import DevicePending, finish_batch

KeyPart = int | str


def derive_seed(*parts: KeyPart) -> int:
    """A 63-bit seed from ``parts`` (integers and strings): the same in every process, on every
    platform and Python version (strings go through CRC-32, never ``hash``)."""
    return int(seed_words(parts, 1)[0])


def seed_words(parts: tuple[KeyPart, ...], n: int) -> np.ndarray:
    """``n`` 63-bit seeds from numpy's ``SeedSequence`` over ``parts``; word *i* does not depend on
    ``n``, so it is sample *i*'s seed however many samples a pass has."""
    entropy = [zlib.crc32(p.encode()) if isinstance(p, str) else int(p) % 2**64 for p in parts]
    return np.random.SeedSequence(entropy).generate_state(n, np.uint64) >> np.uint64(1)


class SeededSampler(Sampler[tuple[int, int]]):
    """Yields ``(sample seed, index)`` for every index of a dataset of ``n`` items, shuffled or in
    order. Pass *e* (the *e*-th iteration that yields) uses seeds and order from (key, e) alone."""

    def __init__(self, n: int, key: tuple[KeyPart, ...], shuffle: bool) -> None:
        self.n, self.key, self.shuffle = n, tuple(key), shuffle
        self.passes = 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[tuple[int, int]]:
        # Counted on the first draw, not on ``iter()``: a DataLoader may make an iterator it never uses.
        epoch = self.passes
        self.passes += 1
        seeds = seed_words((*self.key, epoch, "augment"), self.n)  # an array: 8 bytes a sample
        if self.shuffle:
            order = torch.Generator().manual_seed(derive_seed(*self.key, epoch, "order"))
            indices: Sequence[int] = torch.randperm(self.n, generator=order).tolist()
        else:
            indices = range(self.n)
        for index in indices:
            yield int(seeds[index]), index


def _global_states() -> tuple:
    return random.getstate(), np.random.get_state()


def _same_states(a: tuple, b: tuple) -> bool:
    (py_a, np_a), (py_b, np_b) = a, b
    return py_a == py_b and all(np.array_equal(x, y) for x, y in zip(np_a, np_b))


class SeededSamples(Dataset):
    """``dataset[index]`` computed with torch's default generator seeded by the sample's seed and
    restored after; indexed by the ``(seed, index)`` pairs of a ``SeededSampler``. Picklable, so it
    crosses to workers under every start method."""

    _warned = False  # per process: one warning is enough

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self._checked = False  # this copy's first sample was checked (each worker has its copy)

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, int]) -> Any:
        seed, index = key
        generator = torch.default_generator
        saved = generator.get_state()
        generator.manual_seed(seed)
        check = not (self._checked or SeededSamples._warned)
        before = _global_states() if check else None
        try:
            item = self.dataset[index]
        finally:
            generator.set_state(saved)
        if before is not None:
            self._checked = True
            if not _same_states(before, _global_states()):
                SeededSamples._warned = True
                warnings.warn(
                    "a transform drew from Python's random or numpy's global generator; those draws "
                    "are not seeded per sample, so they depend on the worker count. Draw from torch "
                    "instead (every torchvision transform does).",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return item


class FirstBatches:
    """The first ``train_batches`` batches of every pass (epoch) over ``batches``: a batch sampler
    (``seeded_loader``: the later batches are never loaded) or any loader (a framework's own, whose
    loop runs its epochs itself). Each new iteration is a new pass, capped again; its length is the
    capped one, and every other attribute is the wrapped one's (``dataset``, ``batch_size``, ...).
    The one cap of a fast dev run's training passes, in every framework."""

    def __init__(self, batches: Any, train_batches: int) -> None:
        if train_batches < 1:
            raise ValueError(f"train_batches must be >= 1, not {train_batches}")
        self.batches, self.train_batches = batches, train_batches

    def __len__(self) -> int:
        return min(len(self.batches), self.train_batches)

    def __iter__(self) -> Iterator:
        return itertools.islice(iter(self.batches), self.train_batches)

    def __getattr__(self, name: str) -> Any:
        if name == "batches":  # not set yet (unpickling): never recurse
            raise AttributeError(name)
        return getattr(self.batches, name)


def first_batches(loader: Any, train_batches: int | None) -> Any:
    """``loader`` with every pass capped at ``train_batches`` batches (``FirstBatches``); ``loader``
    itself where there is no cap (None: a real run)."""
    return loader if train_batches is None else FirstBatches(loader, train_batches)


class DeviceBatches:
    """A DataLoader whose ``DevicePending`` batch elements come out as finished float images on
    ``device`` (``device_augment.finish_batch``); other elements are left as the loader gives them.
    Its length, workers, dataset and sampler are the loader's."""

    def __init__(self, loader: DataLoader, device: torch.device | str) -> None:
        self.loader, self.device = loader, torch.device(device)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator:
        for batch in self.loader:
            yield _finished(batch, self.device)

    def __getattr__(self, name: str) -> Any:  # num_workers, dataset, batch_sampler, ...
        if name == "loader":  # not set yet (unpickling): never recurse
            raise AttributeError(name)
        return getattr(self.loader, name)


def _finished(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, DevicePending):
        return finish_batch(batch, device)
    if isinstance(batch, (list, tuple)) and any(isinstance(item, DevicePending) for item in batch):
        return [_finished(item, device) for item in batch]
    return batch


def seeded_loader(
    dataset: Dataset,
    key: tuple[KeyPart, ...],
    batch_size: int,
    *,
    shuffle: bool = False,
    drop_last: bool = False,
    num_workers: int = 0,
    persistent_workers: bool = False,
    pin_memory: bool = False,
    collate_fn: Callable | None = None,
    multiprocessing_context: Any = None,
    train_batches: int | None = None,
    device: torch.device | str | None = None,
) -> DataLoader | DeviceBatches:
    """A DataLoader over ``dataset`` whose shuffle, augmentation draws and worker seeds come from
    ``key`` and the pass alone (module docstring). ``collate_fn`` defaults to the dataset's own
    (Avalanche datasets carry one) or torch's default. ``train_batches`` ends every pass after that
    many batches (a fast dev run's training passes, ``FirstBatches``); the batches it yields are the
    full loader's first ones. With a ``device``, items a ``DeviceTransform`` left pending are finished there
    (``DeviceBatches``)."""
    sampler = SeededSampler(len(dataset), key, shuffle)  # type: ignore[arg-type]
    batches = BatchSampler(sampler, batch_size, drop_last)  # type: ignore[arg-type]  # typed for int indices; it batches our (seed, index) pairs alike
    workers_seed = torch.Generator().manual_seed(derive_seed(*key, "workers"))
    collate = collate_fn or getattr(dataset, "collate_fn", None)
    loader = DataLoader(
        SeededSamples(dataset),
        batch_sampler=first_batches(batches, train_batches),
        num_workers=num_workers,
        persistent_workers=persistent_workers and num_workers > 0,
        pin_memory=pin_memory,
        collate_fn=collate,
        generator=workers_seed,
        multiprocessing_context=multiprocessing_context,
    )
    return loader if device is None else DeviceBatches(loader, device)
