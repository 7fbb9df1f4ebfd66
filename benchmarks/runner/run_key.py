"""A run's place in a results store: its key (label, dataset, tasks, seed, half-base split, class
order), the file stem that names its result, checkpoint, lock and log, and the label's folder name.
``benchmarks.runner.results`` lays the store out by it (docs/results-schema.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

#: a run's file stem (``RunKey.stem``): ``[B<m>-Inc<n>-]T<tasks>-seed<seed>[-order-<order>]``
RUN_STEM = re.compile(
    r"(?:(?P<split>B\d+-Inc\d+)-)?T(?P<tasks>\d+)-seed(?P<seed>-?\d+)(?:-order-(?P<order>\w+))?"
)
#: the name of a finished run's result file: any JSON by this name is read as a result, and named
#: where it is not one (other JSON, such as a saved model's, is not a result and is passed over)
RESULT_NAME = re.compile(RUN_STEM.pattern + r"\.json")


def safe_label(label: str) -> str:
    """A run label as a file or folder name, the one form every path of a run uses (results,
    checkpoints, locks, logs, the comparison's files): each character other than a letter, digit,
    ``.``, ``_`` or ``-`` becomes ``_`` (``my_strategy.strategy:MyStrategy`` ->
    ``my_strategy.strategy_MyStrategy``), as does a leading ``.`` (a hidden folder is never read).
    Registered names and variant labels stay as they are."""
    return re.sub(r"[^A-Za-z0-9._-]|^\.", "_", label) or "_"


@dataclass(frozen=True)
class RunKey:
    """A run's place in the store. ``split``: ``""`` for equal tasks, else the half-base split
    (``"B50-Inc10"``: a first task of 50 classes, then tasks of 10); ``order``: ``""`` for the class
    order the run's protocol gives by default, else the order's name (a suite that varies the order)."""

    label: str
    dataset: str
    n_tasks: int
    seed: int
    split: str = ""
    order: str = ""

    @property
    def stem(self) -> str:
        """``T10-seed0``; ``B50-Inc10-T6-seed0``; ``T10-seed0-order-seed5``: equal tasks and the
        default order keep the names results have always had."""
        split = f"{self.split}-" if self.split else ""
        order = f"-order-{self.order}" if self.order else ""
        return f"{split}T{self.n_tasks}-seed{self.seed}{order}"

    @classmethod
    def from_stem(cls, label: str, dataset: str, stem: str) -> RunKey | None:
        """The key of a file named by ``stem`` (None for another name)."""
        match = RUN_STEM.fullmatch(stem)
        if match is None:
            return None
        return cls(
            label,
            dataset,
            int(match["tasks"]),
            int(match["seed"]),
            match["split"] or "",
            match["order"] or "",
        )

    @property
    def relpath(self) -> Path:
        return Path(self.dataset) / safe_label(self.label) / self.stem

    def __str__(self) -> str:
        split = f"{self.split} ({self.n_tasks} tasks)" if self.split else f"{self.n_tasks} tasks"
        order = f" / order {self.order}" if self.order else ""
        return f"{self.label} / {self.dataset} / {split} / seed {self.seed}{order}"


def default_class_order(config: dict) -> str:
    """The class order a run's protocol gives it when its suite names none of its own: the
    protocol's fixed order for its strategy and dataset, else ``seed1993``."""
    from benchmarks.data.class_orders import DEFAULT_CLASS_ORDER
    from benchmarks.data.protocols import DEFAULT_PROTOCOL, protocol_layer

    protocol = config.get("protocol", DEFAULT_PROTOCOL)
    return protocol_layer(protocol, config["strategy"], config["dataset"]).class_order or DEFAULT_CLASS_ORDER


def key_of_config(label: str, config: dict) -> RunKey:
    """A run's key from its resolved config: its split and, where it is not its protocol's default
    (``default_class_order``), its class order."""
    order = config.get("class_order")
    return RunKey(
        label,
        config["dataset"],
        config["n_tasks"],
        config["seed"],
        config.get("split", ""),
        "" if order is None or order == default_class_order(config) else order,
    )
