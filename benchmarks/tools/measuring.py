"""The primitives of the speed measurements (``speed``, ``train_speed``): functions timed in
interleaved rounds and compared by their per-round ratio, the bytes autograd saves for backward, and
class names of real lengths."""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from typing import Callable

import torch

from benchmarks.core.errors import UserError
from benchmarks.data.datasets import imagenet_wnid_names
from strategies.base import CLIPStrategy
from strategies.contract import Strategy
from strategies.registry import get_strategy


def class_names(n_classes: int) -> list[str]:
    """The first ``n_classes`` ImageNet-1K class names (at most 1000)."""
    names = list(imagenet_wnid_names().values())
    if n_classes > len(names):
        raise ValueError(f"at most {len(names)} classes (ImageNet-1K names), not {n_classes}")
    return names[:n_classes]


def own_strategy_class(name: str) -> type[CLIPStrategy]:
    """The strategy registered as ``name``, which the speed tools time step by step: one built on
    ``CLIPStrategy`` (the suite's own and its adapters); anything else is one line."""
    cls = get_strategy(name)
    if not issubclass(cls, CLIPStrategy):
        raise UserError(f"{name}: the speed tools time strategies built on strategies.base.CLIPStrategy")
    return cls


def own_strategy(strategy: Strategy) -> CLIPStrategy:
    """``strategy`` as the runner built it, read as the ``CLIPStrategy`` the speed tools time."""
    if not isinstance(strategy, CLIPStrategy):
        raise UserError(
            f"the speed tools time strategies built on CLIPStrategy, not {type(strategy).__name__}"
        )
    return strategy


def wait_for_device() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def interleaved(
    functions: dict[str, Callable[[], object]], repeats: int, wait: Callable[[], None] = wait_for_device
) -> dict[str, list[float]]:
    """Wall times of each function over ``repeats`` rounds, after one warm-up round; ``wait`` ends the
    device's queued work before and after each timing (GPU kernels run asynchronously).

    The functions run in turn within a round, so drifts in machine speed hit them alike; compare
    them with :func:`median_ratio`, whose per-round ratios cancel what the round shares. Each
    round starts one function later than the one before, so that no function always follows the
    same one (on this suite's 2-core VM, two identical ViT-B forwards read 8% apart in fixed order).
    """
    for function in functions.values():
        function()
    names = list(functions)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            wait()
            start = time.perf_counter()
            functions[name]()
            wait()
            times[name].append(time.perf_counter() - start)
    return times


def median_ratio(numerator: list[float], denominator: list[float]) -> float:
    """Median over rounds of ``numerator / denominator`` (both timed in the same round)."""
    return statistics.median(a / b for a, b in zip(numerator, denominator))


@contextmanager
def saved_tensor_bytes(total: list[int]):
    """Sum the bytes of every tensor autograd saves for backward (activation memory)."""

    def pack(tensor):
        total[0] += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield
