"""The strategy's data loaders: seeded draws that never depend on the worker count
(``benchmarks.data.loaders``), and a fast dev run's cap on every training pass."""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader

from benchmarks.data.device_augment import DevicePending, finish_batch
from benchmarks.data.loaders import DeviceBatches, seeded_loader

LOADER_KWARGS = ("num_workers", "persistent_workers", "pin_memory", "collate_fn", "multiprocessing_context")


def _loader_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The loader options among the keyword arguments of ``strategy.train`` / ``eval`` (Avalanche
    passes every one of them on; ``pin_memory=None`` means its default, off)."""
    return {k: v for k, v in kwargs.items() if k in LOADER_KWARGS and v is not None}


class SeededLoaders:
    """Mixin of ``CLIPStrategy``: Avalanche's train and eval loaders and the strategy's own, all
    seeded. Reads ``cfg``, ``device``, ``seed``, ``task_classes`` and ``max_train_batches`` (None, or
    the batches a training pass may take: a fast dev run)."""

    max_train_batches: int | None

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
        return self.seed, len(self.task_classes), purpose

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
        ``max_train_batches`` batches; an evaluation pass is never cut short.

        Its shuffle and every augmentation draw depend only on (run seed, task, ``purpose``, pass,
        sample index), never on the worker count (``benchmarks.data.loaders``): give each loader that
        augments or shuffles a purpose of its own, so its draws differ from other loaders'.
        """
        options = self.loader_options()
        options["persistent_workers"] = options["persistent_workers"] and passes > 1
        return seeded_loader(
            dataset,
            self.loader_key(purpose),
            batch_size or self.cfg.eval_batch_size,
            shuffle=shuffle,
            max_batches=self.max_train_batches if training else None,
            device=self.device,
            **options,
        )

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
            max_batches=self.max_train_batches,
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
