"""The class order as a variance axis (issue 59): what pairs two runs (``Unit``: class order and
seed), and each order's row of a comparison (``analysis.order_figure`` draws how much the order
moves each method).

A suite may list several class orders (``benchmarks.runner.suites``); each result keeps its order's
name in ``config.class_order`` and, where it is not its protocol's default, in its key
(``RunKey.order``, the file stem's ``-order-<name>``). ``analysis.pairing`` pairs runs by unit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from analysis.statistics import Interval


class Unit(NamedTuple):
    """What one run of each strategy shares with its pair: its class order (``RunKey.order``:
    ``""`` for its protocol's default) and its seed."""

    order: str
    seed: int

    def __str__(self) -> str:
        return str(self.seed) if not self.order else f"{self.seed} (order {self.order})"


def units_phrase(units) -> str:
    """n, said as orders x seeds: ``2 orders × 3 seeds``, ``1 order × 2 seeds``, and ``2 orders ×
    1–3 seeds`` where the orders have different seed counts."""
    per_order = [sum(1 for u in units if u.order == order) for order in dict.fromkeys(u.order for u in units)]
    low, high = min(per_order), max(per_order)
    seeds = f"{low}–{high} seeds" if low != high else f"{low} seed{'s' if low > 1 else ''}"
    return f"{len(per_order)} order{'s' if len(per_order) > 1 else ''} × {seeds}"


@dataclass
class OrderRow:
    """One class order of a comparison that has several: its paired seeds and their difference."""

    order: str  # the order's name (the config's ``class_order``)
    seeds: list[int]
    mean: float  # the strategy's metric, mean over the seeds
    baseline_mean: float
    estimate: float  # mean over the seeds of (strategy - baseline)
    difference: Interval | None = None  # over the order's seeds and the test images
