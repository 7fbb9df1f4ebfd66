"""Class orders for class-incremental splits.

A class order is a permutation of the dataset's label ids; task ``k`` of a ``T``-task split takes
the ``k``-th contiguous block of it. The order is chosen by name (``--class-order``) and stored in
every result so that a run can be traced back to it.
"""

from __future__ import annotations

import re

import numpy as np

from benchmarks.core.errors import UserError

DEFAULT_CLASS_ORDER = "seed1993"

# The fixed CIFAR-100 order of iCaRL/PODNet, reused by DyTox, Continual-CLIP and MoE-Adapters
# (their `class_orders/cifar100.yaml`). Public list, verified to be a permutation of 0..99.
DYTOX_CIFAR100_ORDER: tuple[int, ...] = (
    87, 0, 52, 58, 44, 91, 68, 97, 51, 15,
    94, 92, 10, 72, 49, 78, 61, 14, 8, 86,
    84, 96, 18, 24, 32, 45, 88, 11, 4, 67,
    69, 66, 77, 47, 79, 93, 29, 50, 57, 83,
    17, 81, 41, 12, 37, 59, 25, 20, 80, 73,
    1, 28, 6, 46, 62, 82, 53, 9, 31, 75,
    38, 63, 33, 74, 27, 22, 36, 3, 16, 21,
    60, 19, 70, 90, 89, 43, 5, 42, 65, 76,
    40, 30, 23, 85, 2, 95, 56, 48, 71, 64,
    98, 13, 99, 7, 34, 55, 54, 26, 35, 39,
)  # fmt: skip

_SEED_NAME = re.compile(r"seed(-?\d+)")


def seeded_order(n_classes: int, seed: int = 1993) -> list[int]:
    """Return ``numpy.random.seed(seed); numpy.random.permutation(n_classes)`` as a list.

    A private ``RandomState`` draws the identical sequence without touching numpy's global RNG,
    so choosing a class order never perturbs the training seed.
    """
    if n_classes < 1:
        raise ValueError(f"n_classes must be positive, got {n_classes}")
    return [int(c) for c in np.random.RandomState(seed).permutation(n_classes)]


def resolve_class_order(name: str, n_classes: int, dataset: str) -> list[int]:
    """Turn a class-order name into a permutation of ``range(n_classes)``.

    Names: ``seed<N>`` (``seed1993`` is the default) or ``dytox`` (CIFAR-100 only).
    """
    match = _SEED_NAME.fullmatch(name)
    if match:
        return seeded_order(n_classes, int(match.group(1)))
    if name == "dytox":
        if dataset != "cifar100" or n_classes != len(DYTOX_CIFAR100_ORDER):
            raise UserError(
                f"class order 'dytox' is the fixed CIFAR-100 list and does not apply to dataset "
                f"'{dataset}' with {n_classes} classes; use --class-order seed1993 (or seedN) instead"
            )
        return list(DYTOX_CIFAR100_ORDER)
    raise UserError(
        f"unknown class order '{name}'; valid: seed1993 (default), seedN for any integer N, "
        f"dytox (CIFAR-100 only)"
    )
