"""Build one run: resolve its options once (``resolve``: the strategy, its config, its precision,
where its pixels are augmented, its limits) and build its stream and a fresh strategy exactly as the
runner trains them (``build_run``). The config a result records, and whose hash names it, is derived
from the resolved run (``ResolvedRun.config``). The runner (``benchmarks.runner.execute``), the
tools and the miniature build their runs here.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING

from torch.utils.data import Subset

from benchmarks.backbone.weights import BackboneSpec, recorded_backbone, weights_file
from benchmarks.core.environment import seed_everything, set_deterministic
from benchmarks.core.errors import UserError
from benchmarks.core.precision import resolve_precision
from benchmarks.data.class_orders import resolve_class_order
from benchmarks.data.datasets import is_fake_data_root, load_dataset
from benchmarks.data.device_augment import AugmentOn, stream_transforms
from benchmarks.data.resized_cache import with_resized_cache
from benchmarks.data.splits import Tasks, split_classes
from benchmarks.data.streams import CILStream, build_stream, spread_indices, validation_split
from benchmarks.runner.limits import RunLimits
from benchmarks.runner.result_record import config_hash
from benchmarks.runner.run_spec import RunSpec, dataset_loader_options
from strategies.config import StrategyConfig
from strategies.contract import OptionalMembers, Strategy, config_class
from strategies.plugins import OPTION as PLUGINS
from strategies.plugins import build_plugins, plugin_table
from strategies.registry import get_strategy
from strategies.settings import RunSettings

if TYPE_CHECKING:
    from benchmarks.backbone import CLIPBackbone


@lru_cache(maxsize=4)
def _dataset(name: str, data_root: str, options: tuple):
    return load_dataset(name, data_root, **dict(options))


def load_run_data(spec: RunSpec, data_root: str):
    """The run's dataset (train and test splits), loaded once per process for runs that share it."""
    options = dataset_loader_options(spec.dataset_options)
    return _dataset(spec.dataset, data_root, tuple(sorted(options.items())))


@dataclass(frozen=True)
class ResolvedRun:
    """A run resolved once (``resolve``): everything its numbers depend on besides the code, each in
    its final form. ``config`` (what its result records, hashed but for ``UNHASHED_CONFIG_KEYS``) is
    derived from it, never assembled elsewhere."""

    spec: RunSpec
    strategy_cls: type
    strategy_cfg: StrategyConfig  # the suite's options, scaled and limited
    precision: str  # resolved: fp32, tf32, fp16 or bf16 ("auto" with the strategy's amp)
    # where the stream's training pixels are augmented, after the strategy's choice: pil for one whose
    # loaders do not finish pending pixels (the suite's setting is spec.augment_on, which is recorded)
    augment_on: AugmentOn
    option_sources: dict[str, str]  # config field -> the suite table it came from (not hashed)
    plugins: dict | None  # the suite's Avalanche plugins (strategies.plugins), checked; None: none
    fake_data: bool  # computed on benchmarks.tools.fake_data's files (never a real result)

    @property
    def limits(self) -> RunLimits:
        """The run's limits (``spec.limits``): none for a real run."""
        return self.spec.limits

    @property
    def config(self) -> dict:
        """The run's config as its result records it (``config_hash`` names the result)."""
        config = {
            **self.spec.config,
            "augment_on": self.spec.augment_on,  # recorded, not hashed (results.UNHASHED_CONFIG_KEYS)
            "backbone": recorded_backbone(self.spec.backbone),
            "precision": self.precision,
            "strategy_config": self.strategy_cfg.to_dict(),
            "option_sources": dict(self.option_sources),
        }
        if self.plugins:  # absent without plugins, so that other runs' hashes stay as they were
            config[PLUGINS] = self.plugins
        if (loaded := weights_file(backbone_spec(self.spec))) is not None:
            config["weights_file"] = loaded  # the file's name and SHA-256: recorded, not hashed
        if self.fake_data:
            config["fake_data"] = True  # a result on benchmarks.tools.fake_data's files is never a real one
        return config

    @cached_property  # a str: computed once per resolved run, however often the runner asks
    def config_hash(self) -> str:
        return config_hash(self.config)

    def settings(self, show_progress: bool = False) -> RunSettings:
        """How the run's strategy runs (``strategies.settings``), from the resolved run."""
        return RunSettings(
            device=self.spec.device,
            precision=self.precision,
            show_progress=show_progress,
            seed=self.spec.seed,
            train_batches=self.limits.train_batches,
            augment_on=self.augment_on,
        )


def resolve(spec: RunSpec, data_root: str) -> ResolvedRun:
    """The run resolved once (``ResolvedRun``).

    Options come from the suite's tables, most specific first (``benchmarks.runner.suites``), then the
    strategy's defaults; ``config.option_sources`` records where each field's value came from
    (not hashed: it names a cause, not a value). Precision "auto" resolves with the strategy's
    ``amp`` (fp32 for a method that is fp32 officially); ``augment_on`` is the suite's for a strategy
    whose loaders finish pending pixels, else pil; the run's limits (``spec.limits``) cap the recipe."""
    strategy_cls = get_strategy(spec.strategy)
    options = dict(spec.strategy_options)
    plugins = _plugins(spec, strategy_cls, options.pop(PLUGINS, None))
    try:
        strategy_cfg = config_class(strategy_cls).from_dict(options, spec.strategy)
    except UserError as err:
        # The base config names its options exactly; a strategy's own checks name them in the text.
        named = err.options or [k for k in spec.option_sources if re.search(rf"\b{re.escape(k)}\b", str(err))]
        where = sorted({suite_table(spec.option_sources[k]) for k in named if k in spec.option_sources})
        message = f"{err} (set in {', '.join(where)})" if where else str(err)
        raise UserError(message, options=err.options) from None
    precision = resolve_precision(spec.precision, spec.device, strategy_cfg.amp)
    sources = {name: spec.option_sources.get(name, "default") for name in strategy_cfg.to_dict()}
    if spec.epoch_scale != 1.0:
        strategy_cfg, scaled = strategy_cfg.with_epoch_scale(spec.epoch_scale)
        for name in scaled:
            sources[name] += f" x epoch_scale {spec.epoch_scale:g}"
    strategy_cfg = _limited_config(strategy_cfg, spec.limits, sources)
    # Pending pixels only for a strategy whose own loaders finish them; any other gets finished
    # tensors (the same pixels: device_augment is bit-identical to PIL).
    augment_on = spec.augment_on if OptionalMembers(strategy_cls).finishes_pending_images else "pil"
    return ResolvedRun(
        spec,
        strategy_cls,
        strategy_cfg,
        precision=precision,
        augment_on=augment_on,
        option_sources=sources,
        plugins=plugins or None,
        fake_data=is_fake_data_root(data_root) and spec.dataset != "synthetic",
    )


def _plugins(spec: RunSpec, strategy_cls, value) -> dict | None:
    """The suite's Avalanche plugins for the run (``strategies.plugins``), checked, or None."""
    if value is None:
        return None
    where = suite_table(spec.option_sources.get(PLUGINS, "defaults"))
    table = plugin_table(value, spec.strategy, where)
    if table and not OptionalMembers(strategy_cls).avalanche_plugins:
        raise UserError(
            f"{spec.strategy} does not run Avalanche's loop, so the plugins {sorted(table)} cannot attach "
            f"to it (set in {where}); drop them for this strategy"
        )
    if check := OptionalMembers(strategy_cls).check_plugins:  # before any work, not at task 2
        check(build_plugins(table))
    return table


def suite_table(source: str) -> str:
    """Where a suite set an option (a ``config.option_sources`` value), as the suite's TOML spells it:
    ``strategy.my_pkg.mod:Class`` -> ``[strategy."my_pkg.mod:Class"]``, ``defaults`` -> ``[defaults]``;
    a protocol's option -> ``protocol = "as-published"``."""
    table, _, name = source.partition(".")  # the name after the first dot may hold dots itself
    if table == "protocol":
        return f"protocol = {json.dumps(name.split('.')[0])}"
    if not name:
        return f"[{table}]"
    return f"[{table}.{name if re.fullmatch(r'[A-Za-z0-9_-]+', name) else json.dumps(name)}]"


def settings_from_the_suite(label: str, dataset: str, config: dict) -> str:
    """One line: the options run ``config`` took from the suite rather than its strategy's Config,
    each with its table, and the epoch scale (what ``config.option_sources`` records)."""
    values, parts = config["strategy_config"], []
    for name, source in config["option_sources"].items():
        table, _, change = source.partition(" ")  # e.g. "default x epoch_scale 0.125"
        if table == "default" and not change:
            continue
        origin = "its Config" if table == "default" else suite_table(table)
        parts.append(f"{name} = {values[name]!r} ({origin}{' ' + change if change else ''})")
    taken = ", ".join(parts) if parts else "nothing"
    return f"{label} on {dataset} takes from the suite: {taken}; every other option is its Config's default"


def _limited_config(strategy_cfg, limits: RunLimits, sources: dict[str, str]):
    """The recipe under ``limits``: its epochs and each training batch size it declares
    (``StrategyConfig.training_batch_sizes``) capped; every other option as the real run's."""
    capped = []
    if limits.epochs is not None:
        strategy_cfg, capped = strategy_cfg.with_epoch_cap(limits.epochs)
    changes = {}
    if limits.batch_size is not None:
        for name in strategy_cfg.training_batch_sizes:
            if getattr(strategy_cfg, name) > limits.batch_size:
                changes[name] = limits.batch_size
    for name in [*capped, *changes]:
        sources[name] += " capped by --fast-dev-run"
    return dataclasses.replace(strategy_cfg, **changes)


def _limited_stream(
    data,
    class_order: list[int],
    tasks: Tasks,
    limits: RunLimits,
    transforms: tuple[Callable, Callable],
    validation: dict | None = None,
    evaluate_test: bool = True,
) -> CILStream:
    """The run's stream under ``limits``: ``train_images_per_class`` training images a class, and
    ``test_images_per_task`` test (and validation) images a task, spread over its classes
    (``spread_indices``). The benchmark's own test stream keeps every image (Avalanche wants the
    same classes in train and test); the runner scores ``test_set``. ``validation``: the split held
    out of the training images first (``validation_split``), so that the limits never move it;
    without ``evaluate_test`` it stands in for the test split, which is never touched."""
    groups = split_classes(class_order, tasks, data.name)
    task_of_class = {c: t for t, classes in enumerate(groups) for c in classes}
    held = None
    if validation is not None:
        if data.train is None or data.train_targets is None:
            raise UserError(f"{data.name} has no training split to hold a validation split out of")
        kept, held_out = validation_split(data.train_targets, validation["fraction"], validation["seed"])
        held = (Subset(data.train, held_out), [data.train_targets[i] for i in held_out])
        data = data.subset(train=kept)
    if limits.train_images_per_class is not None and data.train_targets is not None:
        data = data.subset(
            train=spread_indices(data.train_targets, task_of_class, per_class=limits.train_images_per_class)
        )
    train_transform, eval_transform = transforms
    stream = build_stream(
        data,
        tasks,
        class_order,
        train_transform,
        eval_transform,
        validation=held,
        test_is_validation=not evaluate_test,
    )
    if limits.test_images_per_task is None:
        return stream
    limit = limits.test_images_per_task * len(groups)
    test = spread_indices(stream.test_targets, task_of_class, limit=limit)
    stream = dataclasses.replace(
        stream, test_set=stream.test_set.subset(test), test_targets=[stream.test_targets[i] for i in test]
    )
    if held is None:
        return stream
    if not evaluate_test:  # one set, scored once
        return dataclasses.replace(
            stream, validation_set=stream.test_set, validation_targets=stream.test_targets
        )
    assert stream.validation_targets is not None  # build_stream keeps the split it is given
    kept = spread_indices(stream.validation_targets, task_of_class, limit=limit)
    return dataclasses.replace(
        stream,
        validation_set=stream.validation_set.subset(kept),
        validation_targets=[stream.validation_targets[i] for i in kept],
    )


def backbone_spec(spec: RunSpec) -> BackboneSpec:
    """The run's backbone: the model's name and its weights (None: random)."""
    return BackboneSpec(model=spec.backbone["model"], pretrained=spec.backbone["pretrained"])


@dataclass(frozen=True)
class BuiltRun:
    """A run as the runner builds it (``build_run``): the resolved run, its stream, a fresh backbone
    and a fresh strategy built on it."""

    resolved: ResolvedRun
    stream: CILStream
    strategy: Strategy  # the contract (strategies.contract) the runner reads
    backbone: CLIPBackbone  # the one the strategy was built with: zero-shot prompts and images

    @property
    def spec(self) -> RunSpec:
        return self.resolved.spec

    @property
    def config(self) -> dict:  # the resolved run config, as its result records it
        return self.resolved.config


def build_run(
    resolved: ResolvedRun,
    data_root: str,
    *,
    show_progress: bool = False,
    plugins=(),
) -> BuiltRun:
    """The run's stream and a fresh strategy on a fresh backbone, exactly as the runner trains them
    (the same on every (re)run): the tools and the miniature build their runs here.

    ``resolved``: ``resolve(spec, data_root)``, or a changed copy of it (a tool's shorter recipe,
    ``dataclasses.replace``); ``plugins``: Avalanche plugins attached before the suite's own (the
    live log, a tool's timer). The run's limits apply to the stream and the strategy's training passes."""
    spec, strategy_cfg = resolved.spec, resolved.strategy_cfg
    data = load_run_data(spec, data_root)
    class_order = resolve_class_order(spec.class_order, len(data.class_names), spec.dataset)
    set_deterministic(spec.deterministic)
    seed_everything(spec.seed, -1)  # a randomly initialised backbone is the same on every (re)run
    from benchmarks.backbone import create_clip  # open_clip: resolving a run (a dry run) needs none

    backbone = create_clip(backbone_spec(spec), spec.device)
    # folder images from their resized cache where one was built (the same pixels, decoded once)
    data = with_resized_cache(data, data_root, backbone.image_size, strategy_cfg.train_augmentation)
    transforms = stream_transforms(
        backbone.image_size, backbone.mean, backbone.std, strategy_cfg.train_augmentation, resolved.augment_on
    )
    stream = _limited_stream(
        data, class_order, spec.tasks, resolved.limits, transforms, spec.validation, spec.evaluate_test
    )
    strategy = resolved.strategy_cls(
        backbone=backbone,
        class_names=stream.class_names,
        config=strategy_cfg,
        settings=resolved.settings(show_progress),
        plugins=[*plugins, *build_plugins(resolved.plugins or {})] or None,
    )
    return BuiltRun(resolved, stream, strategy, backbone)
