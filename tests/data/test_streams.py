"""``benchmarks.data.streams``: class-incremental streams from an explicit class order."""

import pytest
import torch

from benchmarks.core.errors import UserError
from benchmarks.data.class_orders import seeded_order
from benchmarks.data.splits import split_classes
from tests.helpers import seeded_order_stream


def test_split_classes_is_equal_disjoint_and_in_order():
    tasks = split_classes(list(range(9, -1, -1)), 5)
    assert tasks == [[9, 8], [7, 6], [5, 4], [3, 2], [1, 0]]
    with pytest.raises(UserError, match="divide"):
        split_classes(list(range(100)), 7)


@pytest.mark.parametrize("n_tasks", [5, 10, 20])
def test_stream_follows_the_explicit_order_without_touching_global_rng(small_data, n_tasks):
    state = torch.get_rng_state()
    stream = seeded_order_stream(small_data, n_tasks)
    assert torch.equal(state, torch.get_rng_state())
    order = seeded_order(100)
    assert stream.tasks[0] == order[: 100 // n_tasks]
    assert len(stream.train_stream) == n_tasks
    for task, experience in enumerate(stream.train_stream):
        assert set(experience.classes_in_this_experience) == set(stream.tasks[task])
        assert sorted(set(experience.dataset.targets)) == sorted(stream.tasks[task])
        assert len(experience.dataset) == 3 * len(stream.tasks[task])
    assert len(stream.test_set) == 200 and stream.task_of_class[order[-1]] == n_tasks - 1


def test_stream_applies_train_and_eval_transforms(small_data):
    stream = seeded_order_stream(small_data)
    image, label = stream.test_set[0][:2]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32
    assert torch.equal(stream.test_set[0][0], stream.test_set[0][0])  # eval is deterministic
