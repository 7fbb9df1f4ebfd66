"""One run as its suite sets it (``RunSpec``, made by ``benchmarks.runner.suites.expand``): typed
fields, and the hashed identity its result records derived from them (``RunSpec.config``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from benchmarks.core.choices import AugmentOn
from benchmarks.data.splits import Tasks
from benchmarks.runner.limits import RunLimits
from benchmarks.runner.run_key import RunKey, key_of_config

#: strategy options a ``[dataset.NAME]`` table may set for every strategy run on that dataset
DATASET_LEVEL_OPTIONS = ("train_augmentation",)


def dataset_loader_options(dataset_options: dict[str, Any]) -> dict[str, Any]:
    """A ``[dataset.NAME]`` table without the strategy options it may hold: what the loader takes."""
    return {k: v for k, v in dataset_options.items() if k not in DATASET_LEVEL_OPTIONS}


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """One run as its suite sets it: typed fields, built with keywords by ``expand``. Its hashed
    identity (``config``) is derived from them, never stored beside them."""

    label: str
    strategy: str
    dataset: str
    n_tasks: int
    seed: int
    class_order: str
    backbone: dict[str, Any]
    dataset_options: dict[str, Any]
    strategy_options: dict[str, Any]  # every option the suite sets for the run, resolved (strategy_options())
    device: str
    split: str = ""  # "" for equal tasks, else the half-base split ("B50-Inc10")
    zero_shot_targets: tuple[str, ...] = ()
    precision: str = "fp32"  # the suite's setting: auto | fp32 | tf32 | fp16 | bf16 (resolved by resolve)
    deterministic: bool = False
    option_sources: dict[str, str] = field(default_factory=dict, compare=False)  # option -> suite table
    epoch_scale: float = 1.0  # the suite's common factor on every strategy's epochs
    limits: RunLimits = RunLimits()  # none for a real run; RunLimits.fast_dev_run for --fast-dev-run
    # Where the pixels are augmented: the same pixels either way, so recorded in the result's config
    # (by ``building.resolve``) and not hashed. Checked once, by ``expand``.
    augment_on: AugmentOn = "device"
    protocol: str | None = None  # None: the suite names none (one protocol)
    validation: dict[str, Any] | None = None  # {"fraction", "seed"} held out of training, or None
    evaluate_test: bool = True  # False for a tuning run: its test split is never read
    tuned: dict[str, Any] | None = None  # a tuned row's provenance (tuned_record), or None

    @property
    def suite_strategy_options(self) -> dict[str, Any]:
        """The hashed options: the suite's own tables as written, without the options a
        ``[dataset.NAME]`` table set (those stay with the dataset), so that a run's identity does not
        change with how its options were layered."""
        return {
            k: v
            for k, v in self.strategy_options.items()
            if not (k in DATASET_LEVEL_OPTIONS and self.option_sources.get(k, "").startswith("dataset."))
        }

    @property
    def config(self) -> dict[str, Any]:
        """The run's hashed identity, derived from its fields. An entry that a newer setting added is
        absent at its default, so that the configs (and hashes) of runs without it stay as they were;
        ``ResolvedRun.config`` adds what resolving decides."""
        config: dict[str, Any] = {
            "strategy": self.strategy,
            "label": self.label,
            "dataset": self.dataset,
            "dataset_options": self.dataset_options,
            "n_tasks": self.n_tasks,
            **({"split": self.split} if self.split else {}),
            "seed": self.seed,
            "class_order": self.class_order,
            "backbone": self.backbone,
            "strategy_options": self.suite_strategy_options,
            "device": self.device,
            "precision": self.precision,  # the suite's setting; the resolved one replaces it (resolve)
            "deterministic": self.deterministic,
        }
        if self.zero_shot_targets:
            config["zero_shot_targets"] = list(self.zero_shot_targets)
        if self.protocol is not None:
            config["protocol"] = self.protocol
        if self.epoch_scale != 1.0:
            config["epoch_scale"] = self.epoch_scale
        if self.limits.limited:
            config["fast_dev_run"] = self.limits.record()
        if self.validation is not None:
            config["validation"] = self.validation
        if not self.evaluate_test:
            config["evaluate_test"] = False
        if self.tuned is not None:
            config["tuned"] = self.tuned
        return config

    @property
    def key(self) -> RunKey:
        return key_of_config(self.label, self.config)

    @property
    def tasks(self) -> Tasks:
        """What its stream is split by (``benchmarks.data.streams.split_classes``)."""
        return self.split or self.n_tasks
