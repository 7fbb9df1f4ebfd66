"""Class orders for class-incremental splits.

A class order is a permutation of the dataset's label ids; task ``k`` of a ``T``-task split takes
the ``k``-th contiguous block of it. The order is chosen by name (``--class-order``) and stored in
every result so that a run can be traced back to it.
"""

from __future__ import annotations

import re

import numpy as np

from benchmarks.core.errors import UserError
from benchmarks.data.unit import dataset_units

DEFAULT_CLASS_ORDER = "seed1993"


def named_orders() -> dict[str, tuple[str, tuple[int, ...]]]:
    """The fixed orders, by name: (the dataset they apply to, the order). Each dataset unit holds
    its own (``DatasetUnit.class_orders``: CIFAR-100's ``dytox``, ImageNet-R's ``mg_clip_imagenet_r``)."""
    return {
        order_name: (name, order)
        for name, unit in dataset_units().items()
        for order_name, order in unit.class_orders.items()
    }


_SEED_NAME = re.compile(r"seed(-?\d+)")
#: numpy's ``RandomState`` takes seeds in [0, 2**32)
_MAX_SEED = 2**32 - 1


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

    Names: ``seed<N>`` (``seed1993`` is the default), or a fixed list of ``named_orders()``, which
    applies to its one dataset.
    """
    match = _SEED_NAME.fullmatch(name)
    if match:
        seed = int(match.group(1))
        if not 0 <= seed <= _MAX_SEED:  # numpy refuses it, with a traceback
            raise UserError(
                f"class order '{name}': the seed must be between 0 and {_MAX_SEED}; use e.g. seed5"
            )
        return seeded_order(n_classes, seed)
    fixed = named_orders()
    if name in fixed:
        applies_to, order = fixed[name]
        if dataset != applies_to or n_classes != len(order):
            raise UserError(
                f"class order '{name}' is the fixed {applies_to} list and does not apply to dataset "
                f"'{dataset}' with {n_classes} classes; use --class-order seed1993 (or seedN) instead"
            )
        return list(order)
    raise UserError(
        f"unknown class order '{name}'; valid: seed1993 (default), seedN for any N from 0 to {_MAX_SEED}, "
        + ", ".join(f"{n} ({d} only)" for n, (d, _) in fixed.items())
    )
