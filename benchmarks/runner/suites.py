"""Suites: TOML files that say which runs make up an experiment.

A suite lists datasets, task counts or half-base splits, seeds and strategies (or named variants of
a strategy) and the options of each. ``expand`` turns it into fully resolved, plain-data
``RunSpec`` objects; the runner executes those. Format (see ``benchmarks/suites/smoke.toml``)::

    description = "..."
    datasets    = ["cifar100"]
    tasks       = [10, "B50-Inc10"]  # 10 equal tasks; a first task of 50 classes, then tasks of 10
                                     # or per dataset: {cifar100 = ["B0-Inc10"], cub200 = ["B0-Inc20"]}
    seeds       = [0, 1, 2]
    strategies  = ["continual_clip", "finetune", "gr4cil"]   # names or variant labels
    class_order = "seed1993"          # or a fixed list: "dytox", "mg_clip_imagenet_r"; or several
                                      # orders, ["seed1993", "seed0"]: one run per (order, seed)
    protocol    = "one-protocol"      # or "as-published" (benchmarks/data/protocols.py)
    base        = "main"              # optional: start from that suite, this file's tables on top
    device      = "auto"                                      # auto | cpu | cuda
    precision   = "auto"             # auto (fp16 on CUDA, fp32 on CPU) | fp32 | tf32 | fp16 | bf16
    deterministic = false            # deterministic CUDA kernels (bit-identical GPU reruns)
    augment_on  = "device"           # device: pixels augmented in batches on the run's device | pil
    threads     = "auto"             # torch threads of each run process (--threads); not hashed
    workers     = 1                  # runs at once on this machine (--workers): a number or "auto"
    epoch_scale = 1.0                # every strategy's epochs times this, rounded, at least 1
    validation_fraction = 0.1        # optional: held out of each class's training images, per class,
                                     # scored like the test set at every stage (result: validation)
    validation_seed = 0              # which images are held out (default 0)
    evaluate_test = false            # tuning only: the test split is never read; the validation set
                                     # is scored in its place (benchmarks.tune)
    [tuned.LABEL]                    # written by benchmarks.tune: the row's options came from a tune

    [backbone]              model = "ViT-B-16-quickgelu", pretrained = "openai" ("none": random)
    [dataset.NAME]          options of one dataset loader
    [common]                the protocol's common settings: options every strategy inherits, outside
                            ones included, unless its Config declares its own (its official recipe)
    [defaults]              options for every strategy
    [strategy.NAME]         options for one strategy
    [variants.LABEL]        strategy = "NAME" plus options: a labelled row (ablations); its own
                            backbone = {model = "ViT-B-16", pretrained = "laion400m_e32"} over [backbone]
    zero_shot_targets = ["pets", "food101"]   # optional: zero-shot datasets evaluated after the stream
    [launcher]              SLURM options for --launcher slurm
                            (benchmarks.runner.slurm_launcher.SlurmOptions):
                            partition, time (minutes), gpus, cpus, mem_gb, array_parallelism,
                            account, qos, constraint, setup (shell lines), max_requeues

Any option value may be a table keyed by dataset name, e.g. ``epochs = {cifar100 = 70,
imagenet100 = 10}``; the run picks its dataset's entry.

A strategy option set in more than one place resolves from the most specific table to the most
general: ``[variants.LABEL]``, then ``[strategy.NAME]``, then the suite's protocol
(``benchmarks.data.protocols``: a prompt template, and under "as-published" a class order and dataset
options), then ``[defaults]``, then ``[dataset.NAME]`` (only ``train_augmentation`` is both a
dataset and a strategy option), then ``[common]`` for the fields the strategy's Config does not
declare itself (``StrategyConfig.recipe_fields``), then the strategy's own default. ``[common]`` and
``[defaults]`` skip the fields an outside learner never reads (``StrategyConfig.ignored_fields``).
``class_order`` may be set in any of these tables too, for the runs they cover, as one name or a
list of names (the class order as a variance axis, beside the seeds: ``expand`` makes one run per
(order, seed), and a run whose order is not its protocol's default is stored under
``-order-<name>``, ``benchmarks.runner.results.RunKey``). ``epoch_scale`` then multiplies each
strategy's per-task ``epochs`` (not the epochs of second stages). Each result's
``config.option_sources`` says where each value came from.
"""

from __future__ import annotations

import itertools
import tomllib
from pathlib import Path
from typing import Any

from benchmarks.core.choices import MAX_SEED, MAX_VALIDATION_FRACTION, AugmentOn, check_augment_on
from benchmarks.core.errors import UserError
from benchmarks.data.class_orders import DEFAULT_CLASS_ORDER
from benchmarks.data.protocols import DEFAULT_PROTOCOL, ProtocolLayer, check_protocol, protocol_layer
from benchmarks.runner.limits import RunLimits
from benchmarks.runner.run_spec import DATASET_LEVEL_OPTIONS, RunSpec
from benchmarks.runner.suite_backbones import check_backbones, run_backbone
from benchmarks.runner.suite_files import SUITES_DIR, available_suites, suite_file
from benchmarks.runner.task_splits import check_suite_tasks, check_tasks, resolve_tasks, suite_tasks
from strategies.cards import card_of

KNOWN_KEYS = {
    "description",
    "datasets",
    "tasks",
    "seeds",
    "strategies",
    "class_order",
    "device",
    "precision",
    "deterministic",
    "augment_on",
    "threads",
    "workers",
    "backbone",
    "dataset",
    "defaults",
    "strategy",
    "variants",
    "zero_shot_targets",
    "launcher",
    "epoch_scale",
    "protocol",
    "base",
    "common",
    "validation_fraction",
    "validation_seed",
    "evaluate_test",
    "tuned",
}


def check_seeds(seeds: list[int], where: str) -> None:
    """Every seed a whole number in [0, MAX_SEED], or one line naming the first that is not."""
    for seed in seeds:
        if not 0 <= seed <= MAX_SEED:
            raise UserError(f"{where} must be whole numbers from 0 to {MAX_SEED} (2**32 - 1), not {seed}")


def check_selection(
    suite: dict[str, Any],
    strategies: list[str] | None = None,
    datasets: list[str] | None = None,
    tasks: list[int | str] | None = None,
    seeds: list[int] | None = None,
) -> None:
    """The command line's choice among a suite's rows (None: all of them): none empty, each task
    count, split and seed well formed, or one line; torch-free, so a command checks it first."""
    for flag, chosen in (
        ("strategies", strategies),
        ("datasets", datasets),
        ("tasks", tasks),
        ("seeds", seeds),
    ):
        if chosen is not None and not chosen:  # an unset shell variable must not mean the whole suite
            raise UserError(
                f"--{flag} is empty; name at least one (e.g. --{flag} {_first(suite[flag])}), or leave the "
                f"option out for all the suite's {flag}"
            )
    check_tasks(tasks or [], "--tasks: ")
    check_seeds(seeds or [], "--seeds")


def load_suite(name_or_path: str) -> dict[str, Any]:
    """Read a suite by name (``benchmarks/suites/NAME.toml``) or from a TOML file path."""
    path = suite_file(name_or_path)
    suite = _read_suite(path, seen=())
    _check_suite(suite, path)
    suite["name"] = path.stem
    suite["path"] = str(path)  # not a suite key: the file read, for the command's messages
    return suite


def suite_bases(suite: dict[str, Any]) -> list[str]:
    """The suites ``suite`` (as ``load_suite`` read it) starts from, nearest first: its file's
    ``base``, that suite's ``base``, and so on (``load_suite`` has checked the chain)."""
    bases, path = [], Path(suite["path"])
    while name := tomllib.loads(path.read_text(encoding="utf-8")).get("base"):
        bases.append(name)
        path = SUITES_DIR / f"{name}.toml"
    return bases


def _read_suite(path: Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    """A suite file with its ``base`` suite merged under it (tables key by key, lists replaced)."""
    try:
        suite = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise UserError(f"suite file {path} is not valid TOML ({err}); fix the file") from None
    except UnicodeDecodeError as err:  # TOML is UTF-8
        raise UserError(
            f"suite file {path} is not UTF-8 text (byte {err.start}: {err.reason}); save it as UTF-8"
        ) from None
    except OSError as err:
        raise UserError(f"cannot read suite file {path}: {err.strerror}") from None
    unknown = sorted(set(suite) - KNOWN_KEYS)
    if unknown:
        raise UserError(f"suite {path} has unknown key(s) {unknown}; valid keys: {sorted(KNOWN_KEYS)}")
    if "base" not in suite:
        return suite
    base = SUITES_DIR / f"{suite.pop('base')}.toml"
    if not base.exists():
        raise UserError(f"suite {path}: base suite {base.stem!r} does not exist; valid: {available_suites()}")
    chain = (*seen, path.resolve())
    if base.resolve() in chain:
        raise UserError(f"suite {path}: base suite {base.stem!r} makes a circle ({[p.stem for p in chain]})")
    return _merged(_read_suite(base, chain), suite)


def _merged(under: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(under)
    for key, value in over.items():
        both_tables = isinstance(value, dict) and isinstance(under.get(key), dict)
        out[key] = _merged(under[key], value) if both_tables else value
    return out


def _check_suite(suite: dict[str, Any], path: Path) -> None:
    """The shape of a suite, so that a slip in the file is one line, not a traceback or a silently
    ignored table."""
    from benchmarks.data.unit import dataset_names
    from strategies.registry import available

    examples = {"datasets": '["cifar100"]', "strategies": '["gr4cil"]', "tasks": "[10]", "seeds": "[0, 1, 2]"}
    for key, example in examples.items():
        if key not in suite:
            raise UserError(f"suite {path} has no {key}; add e.g. {key} = {example}")
        values = suite[key]
        if key == "tasks" and isinstance(values, dict):  # per dataset: checked entry by entry below
            continue
        element = str if key in ("datasets", "strategies") else int
        kinds = (int, str) if key == "tasks" else (element,)
        if (
            not isinstance(values, list)
            or not values
            or not all(isinstance(v, kinds) and not isinstance(v, bool) for v in values)
        ):
            what = (
                "task counts or splits" if key == "tasks" else "names" if element is str else "whole numbers"
            )
            raise UserError(
                f"suite {path}: {key} must be a non-empty list of {what}, e.g. {key} = {example}; "
                f"got {values!r}"
            )
    check_protocol(suite.get("protocol", DEFAULT_PROTOCOL))
    check_suite_tasks(suite["tasks"], suite["datasets"], f"suite {path}: ")
    check_seeds(suite["seeds"], f"suite {path}: seeds")
    scale = suite.get("epoch_scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale <= 1:
        raise UserError(
            f"suite {path}: epoch_scale must be a number in (0, 1], e.g. epoch_scale = 0.125; got {scale!r}"
        )
    check_validation(suite, f"suite {path}: ")
    check_backbones(suite, path)
    for table, names, kind in (
        ("strategy", available(), "strategy"),
        ("dataset", dataset_names(), "dataset"),
    ):
        for name in suite.get(table, {}):
            if name not in names and not (
                table == "strategy" and ":" in name
            ):  # module:Class is checked on import
                # a typo here would drop the table's options without a word
                raise UserError(
                    f"suite {path} has [{table}.{name}], but there is no {kind} {name!r}; "
                    f"valid: {', '.join(sorted(names))}"
                )


def check_validation(suite: dict[str, Any], where: str) -> None:
    """A suite's validation keys: a fraction in (0, 0.5], a whole seed >= 0, and no seed or
    ``evaluate_test = false`` without a fraction."""
    fraction = suite.get("validation_fraction")
    if fraction is not None and (
        isinstance(fraction, bool)
        or not isinstance(fraction, (int, float))
        or not 0 < fraction <= MAX_VALIDATION_FRACTION
    ):
        raise UserError(
            f"{where}validation_fraction must be a number in (0, {MAX_VALIDATION_FRACTION}], "
            f"e.g. validation_fraction = 0.1; got {fraction!r}"
        )
    seed = suite.get("validation_seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise UserError(f"{where}validation_seed must be a whole number >= 0; got {seed!r}")
    evaluate_test = suite.get("evaluate_test", True)
    if not isinstance(evaluate_test, bool):
        raise UserError(f"{where}evaluate_test must be true or false; got {evaluate_test!r}")
    for key, unset in (("validation_seed", seed is None), ("evaluate_test = false", evaluate_test)):
        if fraction is None and not unset:
            raise UserError(f"{where}{key} needs a validation split; add e.g. validation_fraction = 0.1")
    tuned = suite.get("tuned", {})
    if not isinstance(tuned, dict) or not all(isinstance(v, dict) for v in tuned.values()):
        raise UserError(f"{where}tuned must hold one [tuned.LABEL] table a row; got {tuned!r}")


def validation_record(suite: dict[str, Any]) -> dict[str, Any] | None:
    """The validation split a suite sets, as its runs' configs record it; None without one."""
    fraction = suite.get("validation_fraction")
    if fraction is None:
        return None
    return {"fraction": float(fraction), "seed": int(suite.get("validation_seed", 0))}


def tuned_record(provenance: dict[str, Any]) -> dict[str, Any]:
    """What a tuned row's config records of its ``[tuned.LABEL]`` table: where its options came
    from, not the trial table (which stays in the suite file)."""
    return {k: v for k, v in provenance.items() if k in ("study", "objective", "trials", "strategy")}


def suite_backbones(name: str) -> list[dict[str, Any]]:
    """The backbones suite ``name``'s rows use (its own, then each variant's), read from its file
    without checking the rest (no strategy is imported): what ``prepare --list`` shows."""
    suite = _read_suite(SUITES_DIR / f"{name}.toml", seen=())
    return [run_backbone(suite, label) for label in [None, *suite.get("variants", {})]]


def strategy_options(
    suite: dict[str, Any], label: str, dataset: str, protocol: ProtocolLayer
) -> tuple[dict[str, Any], dict[str, str]]:
    """The suite's options for run ``label`` on ``dataset`` (``protocol``: what the suite's protocol
    sets for it), and the table each came from, most general first so that the most specific wins
    (module docstring); the strategy's own defaults fill in the rest later."""
    from strategies.contract import config_class  # the strategy's own recipe decides what [common] sets
    from strategies.registry import get_strategy

    variant = suite.get("variants", {}).get(label, {})
    strategy = variant.get("strategy", label)
    dataset_table = suite.get("dataset", {}).get(dataset, {})
    config = config_class(get_strategy(strategy))
    recipe, ignored = config.recipe_fields(), config.ignored_fields()
    common = {k: v for k, v in suite.get("common", {}).items() if k not in recipe | ignored}
    defaults = {k: v for k, v in suite.get("defaults", {}).items() if k not in ignored}
    protocol_options = {
        **protocol.strategy_options,
        **({"class_order": protocol.class_order} if protocol.class_order else {}),
    }
    layers = [
        ("common", common),
        (f"dataset.{dataset}", {k: v for k, v in dataset_table.items() if k in DATASET_LEVEL_OPTIONS}),
        ("defaults", defaults),
        (protocol.source, protocol_options),
        (f"strategy.{strategy}", suite.get("strategy", {}).get(strategy, {})),
        (f"variants.{label}", {k: v for k, v in variant.items() if k not in ("strategy", "backbone")}),
    ]
    options, sources = {}, {}
    for source, table in layers:
        for key, value in _for_dataset(table, dataset).items():
            options[key], sources[key] = value, source
    return options, sources


#: options whose value is itself a table, never per dataset (``plugins``: strategies.plugins;
#: ``args``: a framework learner's own options, strategies.frameworks)
TABLE_VALUED_OPTIONS = frozenset({"plugins", "args"})


def _for_dataset(options: dict[str, Any], dataset: str) -> dict[str, Any]:
    """Pick per-dataset entries: ``{"epochs": {"cifar100": 70}}`` -> ``{"epochs": 70}``."""
    resolved = {}
    for key, value in options.items():
        if isinstance(value, dict) and key not in TABLE_VALUED_OPTIONS:
            if dataset not in value:
                raise UserError(
                    f"option {key!r} has no value for dataset {dataset!r} "
                    f"(it lists {sorted(value)}); add one to the suite"
                )
            value = value[dataset]
        resolved[key] = value
    return resolved


def class_orders(value: Any, where: str) -> list[str]:
    """The class orders a suite's ``class_order`` (or ``--class-order``) names: one name, or a
    non-empty list of distinct names; ``where``: the table or flag that set it, for the refusal.
    Each name is checked where the run resolves it (``benchmarks.data.class_orders``)."""
    names = [value] if isinstance(value, str) else value
    example = 'class_order = ["seed1993", "seed0"]'
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise UserError(
            f"class_order ({where}) must be an order name or a list of them, e.g. {example}; got {value!r}"
        )
    if len(set(names)) < len(names):
        raise UserError(f"class_order ({where}) names an order twice ({', '.join(names)}); name each once")
    return names


def _resolve_device(device: str, check: bool = True) -> str:
    import torch

    if not check:  # the device of jobs that run elsewhere (SLURM): nothing to check here
        return device
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in {"cpu", "cuda"}:
        raise UserError(f"unknown device {device!r}; use cpu, cuda or auto")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but no CUDA device is visible; use --device cpu")
    return device


def check_strategy_names(suite: dict[str, Any], strategies: list[str] | None = None) -> None:
    """The strategy of each label to run (``strategies``, else the suite's; a variant's own), known
    by name: a misspelt one is one line before any method, torch or Avalanche is imported."""
    from strategies.registry import check_name

    variants = suite.get("variants", {})
    for label in strategies or suite["strategies"]:
        check_name(variants.get(label, {}).get("strategy", label))


def expand(
    suite: dict[str, Any],
    *,
    strategies: list[str] | None = None,
    datasets: list[str] | None = None,
    tasks: list[int | str] | None = None,
    seeds: list[int] | None = None,
    device: str | None = None,
    class_order: str | list[str] | None = None,
    weights: str | None = None,
    precision: str | None = None,
    deterministic: bool | None = None,
    augment_on: AugmentOn | None = None,
    check_device: bool = True,
    limits: RunLimits | None = None,
) -> list[RunSpec]:
    """All runs of a suite, with the command line's filters and overrides applied. With
    ``check_device`` False, ``device`` (cpu or cuda) is taken as given: the runs execute elsewhere.
    ``limits``: each run's (``RunLimits.fast_dev_run`` for ``--fast-dev-run``), recorded in its config.
    ``class_order``: one order name or several (``--class-order seed1993,seed0``): one run per
    (order, seed), the orders outside the seeds."""
    from benchmarks.core.precision import resolve_precision  # torch: loading a suite needs none

    variants = suite.get("variants", {})
    resolved_device = _resolve_device(device or suite.get("device", "auto"), check_device)
    # The suite's setting, checked here; "auto" is resolved per run (``building.resolve``), where the
    # strategy's config (its ``amp``) is known.
    precision_setting = precision or suite.get("precision", "auto")
    resolve_precision(precision_setting, resolved_device)
    deterministic = bool(suite.get("deterministic", False) if deterministic is None else deterministic)
    augment_on = check_augment_on(augment_on or suite.get("augment_on", "device"))
    suite_order = suite.get("class_order", DEFAULT_CLASS_ORDER)
    protocol = suite.get("protocol")
    targets = tuple(suite.get("zero_shot_targets", ()))
    check_validation(suite, "the suite: ")  # a suite made in memory (benchmarks.tune) too
    validation = validation_record(suite)
    evaluate_test = suite.get("evaluate_test", True)
    tuned = suite.get("tuned", {})
    epoch_scale = float(suite.get("epoch_scale", 1.0))
    runs = []
    check_selection(suite, strategies, datasets, tasks, seeds)
    for dataset in datasets or suite["datasets"]:
        for label in strategies or suite["strategies"]:
            strategy = variants.get(label, {}).get("strategy", label)
            backbone = run_backbone(suite, label, weights)  # a variant's own, if it has one
            card = card_of(strategy)
            official = card.official_options if card else None
            layer = protocol_layer(protocol or DEFAULT_PROTOCOL, strategy, dataset, official)
            options, sources = strategy_options(suite, label, dataset, layer)
            # the command line's --class-order wins over every table
            where = sources.pop("class_order", None)
            orders = class_orders(
                options.pop("class_order", suite_order), f"[{where}]" if where else "the suite's"
            )
            if class_order is not None:
                orders = class_orders(class_order, "--class-order")
            dataset_options = {**suite.get("dataset", {}).get(dataset, {}), **layer.dataset_options}
            entries = tasks or suite_tasks(suite["tasks"], dataset)
            splits = {resolve_tasks(entry, dataset, dataset_options): None for entry in entries}
            for split, n_tasks in splits:  # B0-Inc10 and 10 are one run
                for order, seed in itertools.product(orders, seeds or suite["seeds"]):
                    runs.append(
                        RunSpec(
                            label=label,
                            strategy=strategy,
                            dataset=dataset,
                            n_tasks=n_tasks,
                            seed=seed,
                            class_order=order,
                            backbone=backbone,
                            dataset_options=dataset_options,
                            strategy_options=options,
                            device=resolved_device,
                            split=split,
                            zero_shot_targets=targets,
                            precision=precision_setting,
                            deterministic=deterministic,
                            option_sources=sources,
                            epoch_scale=epoch_scale,
                            limits=limits or RunLimits(),
                            augment_on=augment_on,
                            protocol=protocol,
                            validation=validation,
                            evaluate_test=evaluate_test,
                            tuned=tuned_record(tuned[label]) if label in tuned else None,
                        )
                    )
    return runs


def _first(values: list[Any] | dict[str, list[Any]]) -> Any:
    """An example entry of a suite list (``tasks`` may be a table of lists, by dataset)."""
    return next(iter(values.values()))[0] if isinstance(values, dict) else values[0]
