"""The validation split (``benchmarks.data.streams.validation_split``) on every dataset unit's fake
files: held out of the training split only, disjoint from what is trained on and from the test
split, stratified per class, and the same on every call."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from benchmarks.data.datasets import load_dataset
from benchmarks.data.streams import validation_split
from benchmarks.data.unit import dataset_names
from benchmarks.tools.fake_data import make_fake_data

TRAIN_PER_CLASS = 3
FRACTION = 1 / 3  # one validation image a class, two to train on
#: the units with a training split (pets and food101 are zero-shot targets only)
UNITS = [name for name in dataset_names() if name not in ("pets", "food101")]
OPTIONS = {"synthetic": {"n_train_per_class": TRAIN_PER_CLASS, "n_test_per_class": 1}}


@pytest.fixture(scope="module")
def fake(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("validation-fake")
    make_fake_data(root, None, train_per_class=TRAIN_PER_CLASS, test_per_class=1, weights=False)
    return root


def _digest(image) -> str:
    return hashlib.sha256(np.asarray(image.convert("RGB")).tobytes()).hexdigest()


@pytest.mark.parametrize("name", UNITS)
def test_the_validation_split_is_disjoint_from_training_and_test_and_stratified(fake, name):
    data = load_dataset(name, fake, **OPTIONS.get(name, {}))
    train, held = validation_split(data.train_targets, FRACTION, seed=0)
    assert sorted(train + held) == list(range(len(data.train_targets)))  # every image once
    assert not set(train) & set(held)
    per_class = Counter(data.train_targets[i] for i in held)
    kept = Counter(data.train_targets[i] for i in train)
    assert set(per_class) == set(kept) == set(range(data.n_classes))
    assert set(per_class.values()) == {1} and set(kept.values()) == {TRAIN_PER_CLASS - 1}
    held_images = {_digest(data.train[i][0]) for i in held}
    assert len(held_images) == len(held)
    assert not held_images & {_digest(data.train[i][0]) for i in train}
    assert not held_images & {_digest(data.test[i][0]) for i in range(len(data.test))}
    assert validation_split(data.train_targets, FRACTION, seed=0) == (train, held)


def test_each_class_holds_out_its_rounded_share_and_the_seed_moves_it():
    targets = [0] * 10 + [1] * 4 + [2] * 1 + [3] * 20
    train, held = validation_split(targets, 0.25, seed=0)
    assert Counter(targets[i] for i in held) == {0: 3, 1: 1, 3: 5}  # a one-image class keeps it
    assert Counter(targets[i] for i in train) == {0: 7, 1: 3, 2: 1, 3: 15}
    assert validation_split(targets, 0.25, seed=1)[1] != held
