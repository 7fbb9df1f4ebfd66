"""Which GR4CIL configuration a run is: the ablation tables find their rows from a run's resolved
options, never from its label.

A run's *setting* is its value of each of ``ABLATION_SWITCHES``, with the switches that a disabled
component ignores set to None (e.g. ``tau`` without ``L_sep``), so that two runs that train the
same model compare equal. The defaults come from ``strategies.methods.gr4cil.GR4CILConfig`` and the
settings of a suite's rows from the suite file (``suite_setting``): each is written once.

Both are read on first use, not at import: importing the strategy loads torch and Avalanche
(seconds), which the tables of other strategies and the rest of ``analysis`` never need.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

from analysis.paper_inputs import ReportInputs, split_of
from benchmarks.runner.result_record import RunResult

# The switches the paper's ablations vary: a run whose switches equal GR4CIL's defaults is "the
# default configuration". Like epochs and lr, ``visual_init`` belongs to a suite's training recipe,
# not to the paper's ablation switches (docs/decisions.md P2), so it does not decide a run's row
# (the smoke uses "fresh"). ``threshold_holdout`` counts: zero-shot runs trained on fewer images
# are no ablation row.
ABLATION_SWITCHES = (
    "use_anchor_loss",
    "use_separation_loss",
    "lambda_anc",
    "lambda_sep",
    "tau",
    "compensation",
    "compensation_init",
    "use_prototype_score",
    "beta",
    "gamma",
    "threshold_holdout",
)


@functools.cache
def _defaults() -> dict:
    from strategies.methods.gr4cil import GR4CILConfig

    defaults = {f.name: f.default for f in dataclasses.fields(GR4CILConfig)}
    missing = [name for name in ABLATION_SWITCHES if name not in defaults]
    if missing:  # a renamed option: say so rather than treat every run as non-default
        raise RuntimeError(f"GR4CILConfig has no option(s) {missing}; update ABLATION_SWITCHES")
    return {name: defaults[name] for name in ABLATION_SWITCHES}


def gr4cil_defaults() -> dict:
    """GR4CIL's default value of every ablation switch (``GR4CILConfig``'s field defaults)."""
    return dict(_defaults())


@functools.cache
def _suite_setting(suite: str, label: str) -> dict:
    from benchmarks.runner.suites import expand, load_suite

    loaded = load_suite(suite)
    # One run of the label, resolved by the suite loader itself ([variants.LABEL] over
    # [strategy.gr4cil] over [defaults] ...); the device is only named, never checked.
    (spec,) = expand(
        loaded,
        strategies=[label],
        datasets=loaded["datasets"][:1],
        tasks=loaded["tasks"][:1],
        seeds=loaded["seeds"][:1],
        device="cpu",
        check_device=False,
    )
    if spec.strategy != "gr4cil":
        raise ValueError(f"run {label!r} of suite {suite!r} is {spec.strategy}, not a GR4CIL configuration")
    return {k: v for k, v in spec.strategy_options.items() if k in ABLATION_SWITCHES}


def suite_setting(suite: str, label: str) -> dict:
    """The ablation switches that suite ``suite`` (a name under ``benchmarks/suites``) sets for its
    run ``label``: a ``[variants.LABEL]`` row, or ``gr4cil`` itself, the full model ({} when the
    suite leaves every switch at its default)."""
    return dict(_suite_setting(suite, label))


def gr4cil_setting(run: RunResult) -> dict | None:
    """The run's ablation switches with those a disabled component ignores set to None, or
    None for a run of another strategy."""
    if run.strategy != "gr4cil":
        return None
    options = run.config.get("strategy_config", {})
    return effective_setting({k: options.get(k, v) for k, v in _defaults().items()})


def effective_setting(setting: dict) -> dict:
    setting = dict(setting)
    if not setting["use_anchor_loss"]:
        setting["lambda_anc"] = None
    if not setting["use_separation_loss"]:
        setting["tau"] = setting["lambda_sep"] = None
    if setting["compensation"] == "off":
        setting["compensation_init"] = setting["beta"] = None
    if not setting["use_prototype_score"]:
        setting["gamma"] = None
    return setting


def differing_switches(run: RunResult) -> set[str] | None:
    """Names of the switches where a GR4CIL run differs from the defaults (None: not GR4CIL)."""
    setting = gr4cil_setting(run)
    if setting is None:
        return None
    default = effective_setting(_defaults())
    return {k for k in default if setting[k] != default[k]}


def matches(run: RunResult, overrides: dict) -> bool:
    """Whether a GR4CIL run has exactly the default setting changed by ``overrides``."""
    setting = gr4cil_setting(run)
    return setting is not None and setting == effective_setting({**_defaults(), **overrides})


def default_gr4cil_runs(inputs: ReportInputs, n_tasks: int | None = 10) -> list[RunResult]:
    """GR4CIL runs in the default configuration, one per (dataset, n_tasks, split, seed); with
    ``n_tasks``, of that many equal tasks."""
    wanted = [r for r in inputs.runs if n_tasks is None or (r.n_tasks == n_tasks and not split_of(r))]
    runs = [r for r in wanted if matches(r, {})]
    return first_per(runs, lambda r: (r.dataset, r.n_tasks, split_of(r), r.seed))


def first_per(items: list, ident: Callable) -> list:
    """The first item of each ``ident`` value. Two labels may run the identical configuration
    (e.g. a main run and the "full" row of an ablation suite); such a seed must count once."""
    kept, seen = [], set()
    for item in items:
        if ident(item) not in seen:
            seen.add(ident(item))
            kept.append(item)
    return kept
