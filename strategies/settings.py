"""How a strategy runs, apart from what it learns (its ``Config``): one settings object, taken whole
by every strategy's constructor (``CLIPStrategy``'s and the framework adapters', through
``take_settings``).

The runner builds it from the resolved run (``benchmarks.runner.building``); a strategy built
directly, ``GR4CIL(backbone=..., class_names=..., config=...)``, gets ``RunSettings.resolved(config)``:
the CPU, its config's precision there (fp32), progress bars, torch's initial seed, no cap.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch

from benchmarks.core.errors import UserError
from benchmarks.core.precision import PRECISIONS, resolve_precision
from benchmarks.data.device_augment import AugmentOn


@dataclass(frozen=True)
class RunSettings:
    """A strategy's run settings, each already resolved."""

    device: str | torch.device = "cpu"
    precision: str = "fp32"  # fp32, tf32, fp16 or bf16 ("auto" resolves in ``resolved``)
    show_progress: bool = True  # progress bars
    # the run seed every loader's shuffle and augmentation draws derive from
    # (``benchmarks.data.loaders``); by default (or None) torch's initial seed when the settings are
    # made, so ``torch.manual_seed(s)`` before building a strategy without settings sets it
    seed: int = field(default_factory=torch.initial_seed)
    # every training epoch or pass ends after this many batches (a fast dev run,
    # ``benchmarks.data.loaders.FirstBatches``); None: no cap
    train_batches: int | None = None
    # where the stream's training pixels are augmented, "device" or "pil"
    # (``benchmarks.data.device_augment``), and so where those of images the strategy transforms
    # itself are; the runner gives pil to a strategy whose loaders do not finish pending pixels
    augment_on: AugmentOn = "device"

    def __post_init__(self) -> None:
        if self.seed is None:  # as given before the seed had a default of its own
            object.__setattr__(self, "seed", int(torch.initial_seed()))
        if self.precision not in PRECISIONS:
            raise UserError(
                f"RunSettings(precision={self.precision!r}): give one of {', '.join(PRECISIONS)}, or "
                "RunSettings.resolved(config, precision='auto', ...) to resolve auto with the config's amp"
            )

    @classmethod
    def resolved(cls, config: Any, *, precision: str = "auto", **settings: Any) -> RunSettings:
        """Settings with ``precision`` resolved for ``config`` on the settings' device: "auto" is fp16
        on CUDA and fp32 elsewhere, or fp32 everywhere for a config with ``amp = False``."""
        device = settings.get("device", "cpu")
        return cls(precision=resolve_precision(precision, device, config.amp), **settings)


def refuse_settings_as_keywords(owner: str, keywords: dict[str, Any]) -> None:
    """One line for a run setting given as its own keyword (``device="cuda"``): it belongs in
    ``settings``, and a keyword of that name would otherwise reach Avalanche's constructor."""
    given = [f.name for f in fields(RunSettings) if f.name in keywords]
    if given:
        example = ", ".join(f"{name}=..." for name in given)
        raise TypeError(
            f"{owner}: give {', '.join(given)} in settings=RunSettings({example}) (strategies.settings)"
        )


def take_settings(strategy: Any, backbone: Any, config: Any, settings: RunSettings | None) -> None:
    """What every strategy's constructor does first: ``settings`` (or ``RunSettings.resolved(config)``)
    kept whole as ``strategy.settings``, which the strategy and its parts read
    (``self.settings.precision``, ``self.settings.seed``); ``device`` also as
    a torch device, the attribute Avalanche's templates own; ``config`` as ``strategy.cfg``; and
    ``backbone`` on the device in the settings' precision as ``strategy.backbone``."""
    settings = settings if settings is not None else RunSettings.resolved(config)
    strategy.settings = settings
    strategy.device = torch.device(settings.device)
    strategy.cfg = config
    strategy.backbone = backbone.to(strategy.device)
    strategy.backbone.set_precision(settings.precision)
