"""The strategy's data loaders: seeded draws that never depend on the worker count
(``benchmarks.data.loaders``), a fast dev run's cap on every training pass, and the inputs of an
evaluation set kept from one stage to the next."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from benchmarks.data.device_augment import DevicePending, finish_batch
from benchmarks.data.loaders import DeviceBatches, seeded_loader
from strategies.training.host import StrategyHost

LOADER_KWARGS = ("num_workers", "persistent_workers", "pin_memory", "collate_fn", "multiprocessing_context")
#: host memory the loaded batches of one evaluation set may take to be kept across stages: CIFAR-100's
#: 10,000 test images at 224 px as uint8 (the device-finished eval transform) are 1.5 GB; float
#: images (``augment_on = "pil"``) are four times that, and ImageNet's 50,000 are never kept.
KEPT_INPUTS_BUDGET = 2 * 1024**3


def _nbytes(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return batch.nbytes
    if isinstance(batch, (list, tuple)):
        return sum(_nbytes(item) for item in batch)
    return 0


def _own_memory(batch: Any) -> Any:
    """``batch`` with every tensor a worker handed over in shared memory copied to the process's
    own: each shared one holds a file descriptor, and a kept test set would hold thousands."""
    if isinstance(batch, torch.Tensor):
        return batch.clone() if batch.is_shared() else batch
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple (DevicePending)
        return type(batch)(*(_own_memory(item) for item in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_own_memory(item) for item in batch)
    return batch


class KeptBatches:
    """A loader's batches as it yields them (collated, before the device), recorded during one whole
    pass while they fit in ``budget`` bytes; afterwards ``batches`` replays them, and later passes
    need neither workers nor decoding. Eval transforms draw nothing, so a replay is the same input."""

    def __init__(self, loader: DataLoader, budget: int) -> None:
        self.loader, self.budget = loader, budget
        self.batches: list | None = None  # set once a pass has ended within the budget

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator:
        if self.batches is not None:
            yield from self.batches
            return
        kept: list | None = []
        size = 0
        for batch in self.loader:
            if kept is not None:
                size += _nbytes(batch)
                if size <= self.budget:
                    batch = _own_memory(batch)
                    kept.append(batch)
                else:
                    kept = None  # over the budget: this set is loaded at every stage
            yield batch
        if kept is not None:
            self.batches = kept

    def __getattr__(self, name: str) -> Any:  # num_workers, dataset, batch_sampler, ...
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)


def _loader_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The loader options among the keyword arguments of ``strategy.train`` / ``eval`` (Avalanche
    passes every one of them on; ``pin_memory=None`` means its default, off)."""
    return {k: v for k, v in kwargs.items() if k in LOADER_KWARGS and v is not None}


class SeededLoaders(StrategyHost):
    """Mixin of ``CLIPStrategy``: Avalanche's train and eval loaders and the strategy's own, all
    seeded. Reads ``cfg``, ``device``, ``seed``, ``task_classes`` and ``train_batches`` (None, or
    the batches a training pass may take: a fast dev run)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._keeping: tuple[Any, str] | None = None  # inside ``keeping_inputs``: (dataset, cache key)
        self._kept_inputs: dict[tuple[str, int], tuple[Any, KeptBatches]] = {}

    @contextlib.contextmanager
    def keeping_inputs(self, dataset, cache_key: str) -> Iterator[None]:
        """Within the block, the evaluation loaders of ``dataset`` keep their batches under
        ``cache_key`` (``KeptBatches``, within ``KEPT_INPUTS_BUDGET``), so the next pass over the same
        dataset with the same key, at this stage or a later one, replays them. The runner evaluates
        one test set at every stage: its images are then decoded and transformed once a run."""
        outer = self._keeping
        self._keeping = (dataset, cache_key)
        try:
            yield
        finally:
            self._keeping = outer

    def _kept_loader(self, dataset, cache_key: str, batch_size: int, make: Any) -> Any:
        """The kept batches of ``dataset`` at ``batch_size`` under ``cache_key``, made by ``make()``
        (a DataLoader without a device) on first use."""
        key = (cache_key, batch_size)
        entry = self._kept_inputs.get(key)
        if entry is None or entry[0] is not dataset or entry[1].batches is None:
            entry = (dataset, KeptBatches(make(), KEPT_INPUTS_BUDGET))
            self._kept_inputs[key] = entry  # holds the dataset: its id is never another's
        return entry[1]

    def loader_options(self) -> dict[str, Any]:
        """DataLoader options from the config: workers (kept alive across epochs), pinned memory on CUDA."""
        workers = self.cfg.num_workers
        return {
            "num_workers": workers,
            "persistent_workers": workers > 0,
            "pin_memory": self.device.type == "cuda",
        }

    def loader_key(self, purpose: str) -> tuple[int, int, str]:
        """What a loader's draws derive from: (run seed, task index, purpose)."""
        return self.settings.seed, len(self.task_classes), purpose

    def data_loader(
        self,
        dataset,
        batch_size: int | None = None,
        shuffle: bool = False,
        passes: int = 1,
        purpose: str = "eval",
        *,
        training: bool = False,
    ) -> DataLoader | DeviceBatches:
        """A loader over ``dataset`` with ``loader_options``, for the strategy's own passes
        (evaluation, prototypes, second stages); with several ``passes`` its workers stay alive.
        ``training``: the passes train something, so a fast dev run ends each after
        ``train_batches`` batches; an evaluation pass is never cut short.

        Its shuffle and every augmentation draw depend only on (run seed, task, ``purpose``, pass,
        sample index), never on the worker count (``benchmarks.data.loaders``): give each loader that
        augments or shuffles a purpose of its own, so its draws differ from other loaders'.
        """
        options = self.loader_options()
        options["persistent_workers"] = options["persistent_workers"] and passes > 1
        batch_size = batch_size or self.cfg.eval_batch_size

        def make(device: torch.device | None = self.device):
            return seeded_loader(
                dataset,
                self.loader_key(purpose),
                batch_size,
                shuffle=shuffle,
                train_batches=self.settings.train_batches if training else None,
                device=device,
                **options,
            )

        keeping = self._keeping
        if keeping is None or keeping[0] is not dataset or training or shuffle or purpose != "eval":
            return make()
        kept = self._kept_loader(dataset, keeping[1], batch_size, lambda: make(None))
        return DeviceBatches(kept, self.device)

    # Avalanche's defaults are 0 workers; the config's workers apply unless the caller says otherwise.
    # Both loaders are seeded ones, so Avalanche's own ``train`` and ``eval`` give the same numbers
    # whatever the worker count.
    def make_train_dataloader(self, shuffle: bool = True, drop_last: bool = False, **kwargs):
        options = {**self.loader_options(), **_loader_kwargs(kwargs)}
        self.dataloader = seeded_loader(
            self.adapted_dataset,
            self.loader_key("train"),
            self.train_mb_size,
            shuffle=shuffle,
            drop_last=drop_last,
            train_batches=self.settings.train_batches,
            device=self.device,
            **options,
        )

    def make_eval_dataloader(self, shuffle: bool = False, **kwargs):
        options = {**self.loader_options(), "persistent_workers": False, **_loader_kwargs(kwargs)}
        self.dataloader = seeded_loader(
            self.adapted_dataset,
            self.loader_key("avalanche-eval"),
            self.eval_mb_size,
            shuffle=shuffle,
            device=self.device,
            **options,
        )

    def _unpack_minibatch(self):
        # A loader that is not the base's (a plugin's, e.g. replay) hands over pending pixels.
        if self.mbatch is not None and isinstance(self.mbatch[0], DevicePending):
            self.mbatch = [finish_batch(self.mbatch[0], self.device), *self.mbatch[1:]]
        super()._unpack_minibatch()
