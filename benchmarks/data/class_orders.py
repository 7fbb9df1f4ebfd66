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

# MG-CLIP's fixed ImageNet-R order (linlany/MindtheGap, class_orders/imagenet_R.yaml, commit f40bfce):
# indices into the 200 sorted ImageNet-R wnids, as its ImageFolder labels them and as this suite does.
MG_CLIP_IMAGENET_R_ORDER: tuple[int, ...] = (
    150, 119, 193, 2, 75, 179, 129, 68, 145, 53, 171, 133, 31, 103, 146, 174, 149, 40, 142, 30,
    183, 156, 167, 166, 124, 56, 109, 198, 185, 170, 51, 55, 77, 32, 45, 23, 115, 39, 134, 177,
    12, 126, 130, 37, 19, 34, 0, 135, 161, 108, 128, 18, 141, 24, 154, 160, 78, 85, 89, 73,
    152, 112, 114, 104, 44, 93, 138, 107, 100, 163, 3, 148, 147, 35, 199, 50, 25, 96, 79, 172,
    98, 140, 22, 162, 6, 27, 60, 144, 197, 67, 165, 196, 102, 71, 65, 47, 9, 122, 42, 63,
    61, 180, 97, 84, 157, 168, 69, 41, 83, 92, 190, 191, 59, 72, 111, 155, 105, 57, 17, 116,
    13, 28, 43, 136, 5, 14, 169, 7, 62, 110, 189, 95, 8, 4, 137, 194, 90, 74, 70, 113,
    186, 132, 192, 33, 36, 158, 188, 94, 121, 164, 58, 11, 178, 151, 184, 1, 10, 64, 15, 106,
    52, 176, 26, 81, 82, 88, 125, 46, 123, 91, 187, 86, 20, 76, 80, 66, 120, 131, 16, 159,
    101, 87, 99, 195, 143, 21, 49, 38, 181, 29, 153, 54, 173, 127, 117, 182, 139, 118, 48, 175,
)  # fmt: skip

#: the fixed orders, by name: (dataset they apply to, the order)
NAMED_ORDERS: dict[str, tuple[str, tuple[int, ...]]] = {
    "dytox": ("cifar100", DYTOX_CIFAR100_ORDER),
    "mg_clip_imagenet_r": ("imagenet_r", MG_CLIP_IMAGENET_R_ORDER),
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

    Names: ``seed<N>`` (``seed1993`` is the default), or a fixed list of ``NAMED_ORDERS``, which
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
    if name in NAMED_ORDERS:
        applies_to, order = NAMED_ORDERS[name]
        if dataset != applies_to or n_classes != len(order):
            raise UserError(
                f"class order '{name}' is the fixed {applies_to} list and does not apply to dataset "
                f"'{dataset}' with {n_classes} classes; use --class-order seed1993 (or seedN) instead"
            )
        return list(order)
    raise UserError(
        f"unknown class order '{name}'; valid: seed1993 (default), seedN for any N from 0 to {_MAX_SEED}, "
        + ", ".join(f"{n} ({d} only)" for n, (d, _) in NAMED_ORDERS.items())
    )
