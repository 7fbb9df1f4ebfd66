"""Class orders: seeded permutations and the fixed DyTox CIFAR-100 list."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.core.errors import UserError
from benchmarks.data.class_orders import resolve_class_order, seeded_order
from benchmarks.data.units.cifar100 import DYTOX_CIFAR100_ORDER


def test_cifar100_default_order_starts_like_the_protocol() -> None:
    assert seeded_order(100)[:5] == [68, 56, 78, 8, 23]


def test_seeded_order_matches_global_seed_semantics_without_touching_global_state() -> None:
    state = np.random.get_state()
    try:
        np.random.seed(7)
        before = np.random.get_state()
        order = seeded_order(50, seed=3)
        after = np.random.get_state()
        assert before[0] == after[0] and np.array_equal(before[1], after[1]) and before[2:] == after[2:]

        np.random.seed(3)
        assert order == np.random.permutation(50).tolist()
    finally:
        np.random.set_state(state)


def test_seeded_order_is_a_permutation_of_python_ints() -> None:
    order = seeded_order(200, seed=0)
    assert sorted(order) == list(range(200))
    assert all(type(c) is int for c in order)


def test_dytox_order_is_a_permutation_of_cifar100() -> None:
    assert len(DYTOX_CIFAR100_ORDER) == 100
    assert sorted(DYTOX_CIFAR100_ORDER) == list(range(100))
    assert DYTOX_CIFAR100_ORDER[:4] == (87, 0, 52, 58)


def test_resolve_names() -> None:
    assert resolve_class_order("seed1993", 100, "cifar100") == seeded_order(100)
    assert resolve_class_order("seed5", 30, "synthetic") == seeded_order(30, 5)
    assert resolve_class_order("dytox", 100, "cifar100") == list(DYTOX_CIFAR100_ORDER)


def test_dytox_order_only_for_cifar100() -> None:
    with pytest.raises(UserError, match="seed1993"):
        resolve_class_order("dytox", 200, "imagenet_r")


@pytest.mark.parametrize("name", ["random", "seed", "seedx", "DyTox"])
def test_unknown_order_names_list_the_valid_ones(name: str) -> None:
    with pytest.raises(UserError, match="valid: seed1993") as error:
        resolve_class_order(name, 100, "cifar100")
    assert "dytox" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("name", ["seed-5", "seed-1", f"seed{2**32}"])
def test_a_seed_numpy_cannot_take_is_one_line_not_a_traceback(name: str) -> None:
    with pytest.raises(UserError, match="between 0 and 4294967295"):
        resolve_class_order(name, 100, "cifar100")
    assert resolve_class_order(f"seed{2**32 - 1}", 10, "synthetic") == seeded_order(10, 2**32 - 1)
