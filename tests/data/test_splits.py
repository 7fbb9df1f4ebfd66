"""Half-base splits ``B{m}-Inc{n}``: their task sizes by PyCIL's rule, and the streams they give."""

import pytest

from benchmarks.core.errors import UserError
from benchmarks.data.class_orders import seeded_order
from benchmarks.data.splits import parse_split, split_classes, split_sizes, task_sizes
from benchmarks.data.streams import build_stream
from benchmarks.data.transforms import eval_transform


@pytest.mark.parametrize(
    "split, sizes",
    [
        ("B50-Inc10", [50, 10, 10, 10, 10, 10]),
        ("B50-Inc25", [50, 25, 25]),
        ("B0-Inc10", [10] * 10),  # B0: the first task is an increment too (PyCIL's init_cls = increment)
        ("B0-Inc30", [30, 30, 30, 10]),  # the remainder: a last smaller task
        ("B50-Inc30", [50, 30, 20]),
        ("B40-Inc30", [40, 30, 30]),
        ("B50-Inc60", [50, 50]),  # an increment past the classes left: one task of what is left
        ("B99-Inc10", [99, 1]),
    ],
)
def test_split_sizes_on_100_classes_follow_pycils_increments(split, sizes):
    assert split_sizes(split, 100) == sizes
    assert sum(sizes) == 100


@pytest.mark.parametrize(
    "split, match",
    [
        ("B100-Inc10", "does not fit the 100 classes"),
        ("B120-Inc10", "does not fit"),
        ("B0-Inc101", "does not fit"),
        ("B50-Inc0", "n >= 1"),
        ("B50Inc10", "neither a task count nor a split"),
        ("b50-inc10", "neither"),
        ("B-5-Inc10", "neither"),
        ("50", "neither"),
    ],
)
def test_a_split_that_does_not_fit_or_parse_is_one_line(split, match):
    with pytest.raises(UserError, match=match) as err:
        split_sizes(split, 100)
    assert "\n" not in str(err.value)


def test_parse_split_reads_leading_zeros_as_numbers():
    assert parse_split("B050-Inc010") == (50, 10)


def test_task_sizes_of_a_count_a_split_and_given_sizes():
    assert task_sizes(4, 20) == [5, 5, 5, 5]
    assert task_sizes("B8-Inc4", 20) == [8, 4, 4, 4]
    assert task_sizes([8, 12], 20) == [8, 12]
    with pytest.raises(UserError, match="do not cover"):
        task_sizes([8, 8], 20)
    with pytest.raises(UserError, match="or a split B<m>-Inc<n>"):
        task_sizes(3, 20)


def test_split_classes_takes_a_split_in_the_class_order():
    order = list(range(19, -1, -1))
    assert split_classes(order, "B8-Inc5") == [order[:8], order[8:13], order[13:18], order[18:]]
    assert split_classes(order, "B0-Inc5") == split_classes(order, 4)


def test_a_half_base_stream_has_its_base_first_and_disjoint_tasks_that_cover_every_class(small_data):
    order = seeded_order(100)
    stream = build_stream(small_data, "B50-Inc10", order, eval_transform(32), eval_transform(32))
    assert [len(t) for t in stream.tasks] == [50, 10, 10, 10, 10, 10]
    assert stream.tasks[0] == order[:50] and stream.n_tasks == len(stream.train_stream) == 6
    learned = [c for classes in stream.tasks for c in classes]
    assert learned == order  # disjoint, consecutive in the order, every class once
    for task, experience in enumerate(stream.train_stream):
        assert set(experience.classes_in_this_experience) == set(stream.tasks[task])
        assert experience.classes_in_order == stream.tasks[task]
        assert len(experience.dataset) == 3 * len(stream.tasks[task])
    assert stream.task_of_class[order[49]] == 0 and stream.task_of_class[order[50]] == 1
