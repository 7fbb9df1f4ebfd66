"""Execute one run: train task after task, evaluate every stage from the strategy's scores,
checkpoint after every task, and store the result JSON with its predictions sidecar (once the run
is built, ``benchmarks.runner.learning`` does all that).

Finished runs with the same resolved config are skipped; killed runs resume from their last
finished task, with the loss scaler's state, so a resumed run ends with the same numbers. A stored
result is never replaced unsaid (``ResultStore.refusal``, checked in ``preflight`` for every run
before any computes), and each stage's scores are checked against the contract before any metric. Every
launcher (``benchmarks.runner.launcher``) ends up here, in this process or in a worker or job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

from benchmarks.backbone import BackboneSpec, check_weights, create_clip, recorded_backbone
from benchmarks.core.environment import Threads, seed_everything, set_deterministic
from benchmarks.core.errors import UserError
from benchmarks.core.heartbeat_lock import read_holder
from benchmarks.core.precision import resolve_precision
from benchmarks.data.class_orders import resolve_class_order
from benchmarks.data.datasets import is_fake_data_root, load_dataset
from benchmarks.data.device_augment import AugmentOn, stream_transforms
from benchmarks.data.resized_cache import with_resized_cache
from benchmarks.data.streams import CILStream, build_stream, split_classes, spread_indices
from benchmarks.runner.learning import RunContext, learn_and_store, training_log
from benchmarks.runner.live_log import LiveLog
from benchmarks.runner.results import ResultStore, config_hash, safe_label
from benchmarks.runner.suites import RunLimits, RunSpec, dataset_loader_options
from benchmarks.runner.zero_shot import zero_shot_target
from strategies.contract import config_class, optional
from strategies.plugins import OPTION as PLUGINS
from strategies.plugins import build_plugins, plugin_table
from strategies.registry import get_strategy


@lru_cache(maxsize=4)
def _dataset(name: str, data_root: str, options: tuple):
    return load_dataset(name, data_root, **dict(options))


def load_run_data(spec: RunSpec, data_root: str):
    """The run's dataset (train and test splits), loaded once per process for runs that share it."""
    options = dataset_loader_options(spec.dataset_options)
    return _dataset(spec.dataset, data_root, tuple(sorted(options.items())))


class ResolvedRun(NamedTuple):
    """A run's strategy class, its config, and the fully resolved run config (hashed for caching)."""

    strategy_cls: type
    strategy_cfg: Any
    config: dict


def resolve(spec: RunSpec, data_root: str) -> ResolvedRun:
    """The strategy class, its config, and the fully resolved run config (hashed for caching).

    Options come from the suite's tables, most specific first (``benchmarks.runner.suites``), then the
    strategy's defaults; ``config.option_sources`` records where each field's value came from
    (not hashed: it names a cause, not a value). Precision "auto" resolves with the strategy's
    ``amp`` (fp32 for a method that is fp32 officially)."""
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
    config = {
        **spec.config,
        "augment_on": spec.augment_on,  # recorded, not hashed (results.UNHASHED_CONFIG_KEYS)
        "backbone": recorded_backbone(spec.config["backbone"]),
        "precision": precision,
        "strategy_config": strategy_cfg.to_dict(),
        "option_sources": sources,
    }
    if plugins:  # absent without plugins, so that other runs' hashes stay as they were
        config["plugins"] = plugins
    if is_fake_data_root(data_root) and spec.dataset != "synthetic":
        config["fake_data"] = True  # a result on benchmarks.tools.fake_data's files is never a real one
    return ResolvedRun(strategy_cls, strategy_cfg, config)


def _plugins(spec: RunSpec, strategy_cls, value) -> dict | None:
    """The suite's Avalanche plugins for the run (``strategies.plugins``), checked, or None."""
    if value is None:
        return None
    table = plugin_table(value, spec.strategy, suite_table(spec.option_sources.get(PLUGINS, "defaults")))
    if table and not optional(strategy_cls, "avalanche_plugins"):
        raise UserError(
            f"{spec.strategy} does not run Avalanche's loop, so the plugins {sorted(table)} cannot attach "
            f"to it (set in {suite_table(spec.option_sources.get(PLUGINS, 'defaults'))}); "
            "drop them for this strategy"
        )
    if check := optional(strategy_cls, "check_plugins"):  # before any work, not at task 2
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


def _limited_stream(data, class_order: list[int], n_tasks: int, limits: RunLimits, transforms) -> CILStream:
    """The run's stream under ``limits``: ``train_images_per_class`` training images a class, and
    ``test_images_per_task`` test images a task, spread over its classes (``spread_indices``). The
    benchmark's own test stream keeps every image (Avalanche wants the same classes in train and
    test); the runner scores ``test_set``."""
    task_of_class = {c: t for t, classes in enumerate(split_classes(class_order, n_tasks)) for c in classes}
    if limits.train_images_per_class is not None and data.train_targets is not None:
        data = data.subset(
            train=spread_indices(data.train_targets, task_of_class, per_class=limits.train_images_per_class)
        )
    stream = build_stream(data, n_tasks, class_order, *transforms)
    if limits.test_images_per_task is None:
        return stream
    test = spread_indices(stream.test_targets, task_of_class, limit=limits.test_images_per_task * n_tasks)
    return dataclasses.replace(
        stream, test_set=stream.test_set.subset(test), test_targets=[stream.test_targets[i] for i in test]
    )


def backbone_spec(spec: RunSpec) -> BackboneSpec:
    """The run's backbone: the model's name and its weights (None: random)."""
    return BackboneSpec(model=spec.backbone["model"], pretrained=spec.backbone["pretrained"])


def preflight(
    runs: list[RunSpec],
    data_root: str,
    *,
    store: ResultStore | None = None,
    force: bool = False,
    save_models: bool = False,
) -> None:
    """Check every run's strategy, options, data, class order, task count and weights up front,
    so that a mistake stops the suite before any long work instead of in the middle of it. With
    ``store``: no run may replace a stored result unsaid (``ResultStore.refusal``: a newer schema,
    another label sharing the folder, another config without ``force``); with ``save_models``:
    every run's strategy can save its model."""
    folders: dict[tuple[str, str], str] = {}
    for spec in runs:  # two labels, one folder (a:b and a_b): each run would overwrite the other
        folder = safe_label(spec.label)
        if (other := folders.setdefault((spec.dataset, folder), spec.label)) != spec.label:
            raise UserError(
                f"runs {other!r} and {spec.label!r} would share the result folder {folder!r}; "
                "rename one of the variants"
            )
    for spec in runs:
        resolved = resolve(spec, data_root)
        if save_models:
            _check_save_model(spec, resolved)
        if store is not None:  # before any run computes, not when the run comes up
            _refuse_replacing(store, spec, config_hash(resolved.config), force, resolved.config)
        data = load_run_data(spec, data_root)
        order = resolve_class_order(spec.class_order, len(data.class_names), spec.dataset)
        split_classes(order, spec.n_tasks, spec.dataset)
        for target in spec.zero_shot_targets:
            strategy_cls = get_strategy(spec.strategy)
            if not all(hasattr(strategy_cls, m) for m in ("zero_shot_text", "zero_shot_predictions")):
                raise UserError(
                    f"strategy {spec.strategy} has no zero-shot predictor; drop zero_shot_targets "
                    "from the suite or run a strategy that has one (gr4cil)"
                )
            zero_shot_target(target, data_root)
    for backbone in {backbone_spec(spec) for spec in runs}:
        check_weights(backbone)


def execute(
    spec: RunSpec,
    store: ResultStore,
    data_root: str,
    *,
    force: bool = False,
    show_progress: bool = True,
    task_lines: bool = False,
    save_model: bool = False,
    log: tuple[str, ...] = (),
    project: str = "",
    threads: Threads = "auto",
) -> tuple[dict | None, str]:
    """Run (or resume, or skip) one run under its lock. Returns its result and what happened; the
    result is None when another process holds the run's lock. ``show_progress``: progress bars;
    ``task_lines``: one line on stderr per finished task instead (a log that is not a terminal);
    ``log``: the live logs to write (``benchmarks.runner.live_log``), ``project`` naming the W&B
    project; ``threads``: the setting the caller gave ``set_threads``, recorded in the result."""
    resolved = resolve(spec, data_root)
    cfg_hash = config_hash(resolved.config)
    _refuse_replacing(store, spec, cfg_hash, force, resolved.config)
    if not force and (done := store.finished(spec.key, cfg_hash)) is not None:
        return done, "cached"
    if save_model:
        _check_save_model(spec, resolved)
    lock = store.lock(spec.key)
    if not lock.acquire():
        holder = read_holder(lock.path)
        return None, f"skipped, running elsewhere ({holder.describe() if holder else 'locked'})"
    try:
        _refuse_replacing(store, spec, cfg_hash, force, resolved.config)  # another process may have stored it
        if not force and (done := store.finished(spec.key, cfg_hash)) is not None:
            result, status = done, "cached (finished by another process)"
        else:
            live = LiveLog(log, store.root, spec.key, {**resolved.config, "suite": project}) if log else None
            with live or contextlib.nullcontext():
                context = RunContext(
                    spec,
                    store,
                    data_root,
                    resolved.strategy_cfg,
                    cfg_hash,
                    force=force,
                    show_progress=show_progress,
                    task_lines=task_lines,
                    save_model=save_model,
                    live=live,
                    threads=threads,
                )
                result, status = _compute(context, resolved)
    except (KeyboardInterrupt, SystemExit):  # stopped, not failed (SLURM's requeue exits this way)
        lock.release()
        raise
    except BaseException as err:  # a user error says it all; anything else is named
        message = str(err) if isinstance(err, UserError) else f"{type(err).__name__}: {err}"
        lock.release(error=message.splitlines()[0] if message else type(err).__name__)
        raise
    lock.release(finished=True)
    if lock.took_over is not None:
        status += f"; took over a stale lock of {lock.took_over.describe()}"
    return result, status


def _refuse_replacing(store: ResultStore, spec: RunSpec, cfg_hash: str, force: bool, config: dict) -> None:
    """One line, and no run, where computing ``spec`` would replace its stored result unsaid."""
    if (why := store.refusal(spec.key, cfg_hash, force, config)) is not None:
        raise UserError(why)


def _check_save_model(spec: RunSpec, resolved: ResolvedRun) -> None:
    if not hasattr(resolved.strategy_cls, "save_model"):
        raise UserError(
            f"{spec.strategy} has no save_model, so --save-models cannot keep its model; drop the flag"
        )


def _compute(context: RunContext, resolved: ResolvedRun) -> tuple[dict, str]:
    """Build the run (``build_run``) with the live log's plugin where it can take one, then learn,
    evaluate and store it (``benchmarks.runner.learning``)."""
    log_plugin = training_log(context, resolved.strategy_cls)
    built = build_run(
        context.spec,
        context.data_root,
        resolved=resolved,
        show_progress=context.show_progress,
        plugins=[log_plugin] if log_plugin is not None else (),
    )
    return learn_and_store(context, built.config, built.stream, built.strategy, log_plugin)


@dataclass(frozen=True)
class BuiltRun:
    """A run as the runner builds it (``build_run``): its resolved options, its stream and a fresh
    strategy on a fresh backbone (``strategy.backbone``)."""

    spec: RunSpec
    strategy_cls: type
    strategy_cfg: Any
    config: dict  # the resolved run config, as its result records it
    stream: CILStream
    strategy: Any
    augment_on: AugmentOn  # where the stream's training pixels are augmented (pil for a strategy
    # whose loaders do not finish pending pixels)


def build_run(
    spec: RunSpec,
    data_root: str,
    *,
    resolved: ResolvedRun | None = None,
    show_progress: bool = False,
    plugins=(),
) -> BuiltRun:
    """The run's stream and a fresh strategy on a fresh backbone, exactly as the runner trains them
    (the same on every (re)run): the tools and the miniature build their runs here.

    ``resolved``: ``resolve(spec, data_root)``, or a changed copy of it (a tool's shorter recipe);
    ``plugins``: Avalanche plugins attached before the suite's own (the live log, a tool's timer).
    The run's limits (``spec.limits``) apply to the stream and the strategy's training passes."""
    strategy_cls, strategy_cfg, config = resolved or resolve(spec, data_root)
    suite_plugins = config.get(PLUGINS) or {}  # checked by resolve, which recorded them
    data = load_run_data(spec, data_root)
    class_order = resolve_class_order(spec.class_order, len(data.class_names), spec.dataset)
    set_deterministic(spec.deterministic)
    seed_everything(spec.seed, -1)  # a randomly initialised backbone is the same on every (re)run
    backbone = create_clip(backbone_spec(spec), spec.device)
    # folder images from their resized cache where one was built (the same pixels, decoded once)
    data = with_resized_cache(data, data_root, backbone.image_size, strategy_cfg.train_augmentation)
    # Pending pixels only for a strategy whose own loaders finish them; any other gets finished
    # tensors (the same pixels: device_augment is bit-identical to PIL).
    augment_on = spec.augment_on if optional(strategy_cls, "finishes_pending_images") else "pil"
    transforms = stream_transforms(
        backbone.image_size, backbone.mean, backbone.std, strategy_cfg.train_augmentation, augment_on
    )
    stream = _limited_stream(data, class_order, spec.n_tasks, spec.limits, transforms)
    strategy = strategy_cls(
        backbone=backbone,
        class_names=stream.class_names,
        config=strategy_cfg,
        device=spec.device,
        precision=spec.precision,
        show_progress=show_progress,
        seed=spec.seed,
        max_train_batches=spec.limits.train_batches,
        augment_on=augment_on,
        plugins=[*plugins, *build_plugins(suite_plugins)] or None,
    )
    return BuiltRun(spec, strategy_cls, strategy_cfg, config, stream, strategy, augment_on)
