"""How a class order is cut into tasks: N equal tasks, a half-base split ``B{m}-Inc{n}``, or task
sizes given. Pure functions, importing nothing heavy: the tables and the suite checks name and size
tasks without loading Avalanche (``benchmarks.data.streams`` builds the streams from these cuts).
"""

from __future__ import annotations

import re

from benchmarks.core.errors import UserError

#: a half-base split as suites and ``--tasks`` write it: a first task of m classes, then tasks of n
SPLIT_PATTERN = re.compile(r"B(\d+)-Inc(\d+)")

#: a run's tasks as a suite gives them: N equal tasks, a split ``"B50-Inc10"``, or the task sizes
Tasks = int | str | list[int]


def parse_split(split: str) -> tuple[int, int]:
    """(m, n) of ``"B{m}-Inc{n}"``; a one-line ``UserError`` for anything else."""
    match = SPLIT_PATTERN.fullmatch(split.strip()) if isinstance(split, str) else None
    if match is None or int(match[2]) < 1:
        raise UserError(
            f"tasks {split!r} is neither a task count nor a split B<m>-Inc<n> with n >= 1; "
            "e.g. 10 (ten equal tasks) or B50-Inc10 (50 classes, then tasks of 10)"
        )
    return int(match[1]), int(match[2])


def split_name(base: int, increment: int) -> str:
    return f"B{base}-Inc{increment}"


def tasks_label(n_tasks: int, split: str = "") -> str:
    """How tables and figures name a run's tasks: ``T=10`` for equal tasks, ``B50 Inc10`` for a
    half-base split, as the papers' tables write it (a B50-Inc10 run is never a T=6 one)."""
    return split.replace("-", " ") if split else f"T={n_tasks}"


def split_sizes(split: str, n_classes: int, dataset: str = "dataset") -> list[int]:
    """The task sizes of a half-base split on ``n_classes`` classes, by PyCIL's rule (G-U-N/PyCIL
    ``utils/data_manager.py`` ``DataManager.__init__`` at 87cc411): the first task holds m classes
    (``B0``: n, PyCIL's init_cls = increment), then tasks of n while a whole one fits, and a last
    smaller task holds the classes left over (B0-Inc30 on 100: 30, 30, 30, 10)."""
    base, increment = parse_split(split)
    first = base or increment
    if base >= n_classes or first > n_classes:  # a base of every class leaves nothing to learn after it
        raise UserError(
            f"split {split} does not fit the {n_classes} classes of {dataset}: its first task takes "
            f"{first}; give B<m>-Inc<n> with m < {n_classes} and n <= {n_classes}"
        )
    sizes = [first]
    while sum(sizes) + increment < n_classes:
        sizes.append(increment)
    if n_classes > sum(sizes):
        sizes.append(n_classes - sum(sizes))
    return sizes


def equal_split(sizes: list[int]) -> bool:
    """Whether ``sizes`` are equal tasks: a split that is one runs as the task count it equals."""
    return len(set(sizes)) == 1


def task_sizes(tasks: Tasks, n_classes: int, dataset: str = "dataset") -> list[int]:
    """The size of each task: ``tasks`` equal ones (they must divide the classes), a split's
    (``split_sizes``), or the sizes given, which must cover the classes."""
    if isinstance(tasks, str):
        return split_sizes(tasks, n_classes, dataset)
    if isinstance(tasks, list):
        if sum(tasks) != n_classes or min(tasks, default=0) < 1:
            raise UserError(f"task sizes {tasks} do not cover the {n_classes} classes of {dataset}")
        return list(tasks)
    if tasks < 1 or n_classes % tasks:
        valid = [k for k in range(2, n_classes + 1) if n_classes % k == 0][:8]
        raise UserError(
            f"{tasks} tasks do not divide the {n_classes} classes of {dataset}; "
            f"use a task count that divides {n_classes}, e.g. {valid}, or a split B<m>-Inc<n>"
        )
    return [n_classes // tasks] * tasks


def split_classes(class_order: list[int], tasks: Tasks, dataset: str = "dataset") -> list[list[int]]:
    """Split a class order into disjoint, consecutive groups of ``task_sizes(tasks, ...)``: equal
    ones for a task count, a first task of m classes then tasks of n for ``"B{m}-Inc{n}"``."""
    groups, start = [], 0
    for size in task_sizes(tasks, len(class_order), dataset):
        groups.append(list(class_order[start : start + size]))
        start += size
    return groups
