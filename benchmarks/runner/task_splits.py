"""A suite's ``tasks``: task counts and half-base splits, for every dataset or per dataset.

``tasks = [10, "B50-Inc10"]`` applies to every dataset of the suite; ``tasks = {cifar100 = ["B0-Inc10"],
cub200 = ["B0-Inc20"]}`` gives each dataset its own list (the LAMDA suites: each dataset at its
papers' increment). An entry is resolved per dataset against its class count (``resolve_tasks``).
"""

from __future__ import annotations

from typing import Any

from benchmarks.core.errors import UserError
from benchmarks.data.splits import equal_split, parse_split, split_name, split_sizes

TaskEntries = list[int | str]


def suite_tasks(tasks: TaskEntries | dict[str, TaskEntries], dataset: str) -> TaskEntries:
    """The suite's task entries for ``dataset``: the list, or its entry of a table keyed by dataset."""
    if not isinstance(tasks, dict):
        return tasks
    if dataset not in tasks:
        raise UserError(
            f"the suite's tasks table has no entry for dataset {dataset!r} "
            f"(it lists {sorted(tasks)}); add one"
        )
    return tasks[dataset]


def check_suite_tasks(tasks: TaskEntries | dict[str, TaskEntries], datasets: list[str], where: str) -> None:
    """A suite's ``tasks``: a list of entries, or a table with a non-empty list for each of its datasets
    and no other key."""
    if not isinstance(tasks, dict):
        check_tasks(tasks, where)
        return
    if unknown := sorted(set(tasks) - set(datasets)):
        raise UserError(f"{where}tasks names dataset(s) {unknown} the suite does not run; valid: {datasets}")
    for dataset in datasets:
        entries = suite_tasks(tasks, dataset)
        if not isinstance(entries, list) or not entries or any(isinstance(e, bool) for e in entries):
            raise UserError(
                f"{where}tasks.{dataset} must be a non-empty list of task counts or splits, "
                f'e.g. ["B0-Inc10"]; got {entries!r}'
            )
        if not all(isinstance(entry, (int, str)) for entry in entries):
            raise UserError(f"{where}tasks.{dataset} must hold task counts or splits; got {entries!r}")
        check_tasks(entries, f"{where}tasks.{dataset}: ")


def check_tasks(tasks: list[int | str], where: str = "") -> None:
    """Task counts >= 1 and splits of the form ``B{m}-Inc{n}``, before any dataset is known."""
    if any(isinstance(n, int) and n < 1 for n in tasks):
        raise UserError(f"{where}task counts must be >= 1; got {tasks}")
    for split in tasks:
        if isinstance(split, str) and not _is_split(split):
            raise UserError(
                f"{where}tasks must be whole numbers or splits B<m>-Inc<n> (n >= 1), "
                f'e.g. [10, "B50-Inc10"]; got {split!r}'
            )


def _is_split(text: str) -> bool:
    try:
        parse_split(text)
    except UserError:
        return False
    return True


def class_count(dataset: str, dataset_options: dict[str, Any]) -> int | None:
    """The dataset's class count under its options (``DatasetUnit.class_count``); None where only its
    files can tell."""
    from benchmarks.data.unit import dataset_unit

    return dataset_unit(dataset).class_count(**dataset_options)


def resolve_tasks(tasks: int | str, dataset: str, dataset_options: dict[str, Any]) -> tuple[str, int]:
    """(split, task count) of one ``tasks`` entry on ``dataset``: ``("", N)`` for N equal tasks, and
    for a split that gives equal tasks (``B0-Inc10`` on 100 classes is 10 tasks: one run, one file);
    ``("B50-Inc10", 6)`` for a half-base one, checked against the dataset's class count."""
    if isinstance(tasks, int):
        return "", tasks
    n_classes = class_count(dataset, dataset_options)
    if n_classes is None:
        raise UserError(
            f"{dataset} does not declare its class count, which split {tasks} needs; give a task count"
        )
    sizes = split_sizes(tasks, n_classes, dataset)
    return ("" if equal_split(sizes) else split_name(*parse_split(tasks))), len(sizes)
