"""Optimisers and learning-rate schedules of the strategies, built from a config's fields
(``optimizer``, ``lr``, ``momentum``, ``weight_decay``, ``schedule``, ``warmup_*``, ``min_lr_ratio``).

* ``cosine_iter``: a cosine over every step of the task, stepped per iteration;
* ``cosine_epoch``: the same cosine, stepped per epoch;
* ``coda_cosine``: the CODA-Prompt codebase's per-epoch factor (``coda_cosine_factor``) as its loop
  applies it: one epoch late (epochs 0 and 1 at the full rate, epoch e at the factor of e - 1).

A linear warm-up runs before either cosine: ``warmup_steps`` steps at (step + 1) / W (MagMax's and
MoE-Adapters' form), or a ``warmup_fraction`` of the scheduled steps, W = floor(fraction x total), at
(step + 1) / (W + 1) (CLAP's ``cosine_schedule_warmup``, the one source that gives a fraction).
The strategy steps the scheduler (``CLIPStrategy.optimizer_step`` and its epoch hook).
"""

from __future__ import annotations

import math
import typing
from typing import Literal

import torch

Optimizer = Literal["adamw", "adam", "sgd"]
Schedule = Literal["cosine_iter", "cosine_epoch", "coda_cosine"]
OPTIMIZERS = typing.get_args(Optimizer)
SCHEDULES = typing.get_args(Schedule)


def coda_cosine_factor(epoch: int, epochs: int) -> float:
    """The CODA-Prompt codebase's per-epoch factor: cos(99 pi e / (200 (K - 1))), e = 0..K-1, from 1
    down to about 0.016 at the last epoch (1 throughout for K = 1)."""
    return 1.0 if epochs <= 1 else math.cos(99 * math.pi * epoch / (200 * (epochs - 1)))


def warmup_cosine_factor(
    step: int, total: int, warmup: int, min_ratio: float, warmup_end: int | None = None
) -> float:
    """Learning-rate factor at ``step`` (0-based) of ``total``: linear warm-up over ``warmup`` steps
    ((step + 1) / ``warmup_end``, by default ``warmup``), then a cosine from 1 down to ``min_ratio``
    at step ``total``."""
    if step < warmup:
        return (step + 1) / (warmup_end or warmup)
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(params: list[torch.nn.Parameter], cfg) -> torch.optim.Optimizer:
    """The config's optimiser over ``params``."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    kind = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    return kind(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg, epochs: int, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """The config's schedule over a task of ``epochs`` epochs of ``steps_per_epoch`` steps."""
    total = max(1, epochs * (steps_per_epoch if cfg.schedule == "cosine_iter" else 1))
    warmup = cfg.warmup_steps or int(cfg.warmup_fraction * total)
    warmup_end = warmup if cfg.warmup_steps else warmup + 1  # the two sources' forms (module docstring)
    if cfg.schedule == "coda_cosine":  # per epoch, no warm-up, its own end point
        # One epoch late, as the official loop runs it: CosineSchedule's constructor leaves
        # last_epoch at -1, so learn_batch's first step() (epoch 1) sets factor(0) again; the last
        # epoch gets factor(K - 2) (fixture coda_prompt.loop, docs/baselines.md §16; D4)
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda epoch: coda_cosine_factor(max(0, epoch - 1), epochs)
        )
    if not warmup:  # the closed form below agrees; this keeps earlier runs' numbers to the last bit
        return torch.optim.lr_scheduler.CosineAnnealingLR(
            optimizer, T_max=total, eta_min=cfg.min_lr_ratio * cfg.lr
        )
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine_factor(step, total, warmup, cfg.min_lr_ratio, warmup_end)
    )
