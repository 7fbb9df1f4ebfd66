"""The body of ``python -m benchmarks.tune`` (its parser and the protocol: ``benchmarks.tune``):
Optuna studies whose trials the runner executes on a validation split. It imports torch, open_clip
and Avalanche through the runner, so the parser leaves it until the command line is checked.
"""

from __future__ import annotations

import argparse
import copy
import functools
import hashlib
import json
import math
import os
import re
import socket
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from benchmarks.core.atomic_io import atomic_write_bytes
from benchmarks.core.choices import OBJECTIVES
from benchmarks.core.errors import UserError
from benchmarks.core.heartbeat_lock import HeartbeatLock, slurm_job_id
from benchmarks.runner.building import resolve
from benchmarks.runner.execute import execute, preflight
from benchmarks.runner.launcher import prepare_runner_process
from benchmarks.runner.result_record import RunResult
from benchmarks.runner.results import ResultStore
from benchmarks.runner.run_spec import RunSpec
from benchmarks.runner.suites import expand, load_suite
from benchmarks.runner.termination import restore_sigterm, stop_on_sigterm
from benchmarks.tune_space import Dimension, read_space

TUNED_SUFFIX = "-tuned"
#: a run's error that makes its trial a failed one (counted in the budget) rather than stopping the tune
TRIAL_ERROR = "error"
#: how often a worker looks again at a study whose last trials run in other workers, or at a run that
#: another worker computes
POLL_SECONDS = 10.0
#: how often a worker tries a lock that another holds for a moment (while it creates the storage, or
#: counts the trials and starts one)
CLAIM_POLL_SECONDS = 0.2
#: suite keys a tuned suite drops: its rows train on every training image and are scored on the test set
TUNING_ONLY_KEYS = ("validation_fraction", "validation_seed", "evaluate_test", "name", "path")


def params_digest(params: dict[str, Any]) -> str:
    """The folder name of a trial's runs: the same values, the same folder (a resumed trial's runs)."""
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]


def trial_suite(
    suite: dict[str, Any], label: str, params: dict[str, Any], fraction: float, seed: int
) -> dict:
    """``suite`` with ``params`` in ``label``'s most specific table, a validation split and no test."""
    trial = copy.deepcopy(suite)
    if label in trial.get("variants", {}):
        trial["variants"][label].update(params)
    else:
        trial.setdefault("strategy", {}).setdefault(label, {}).update(params)
    trial.update(validation_fraction=fraction, validation_seed=seed, evaluate_test=False)
    return trial


def trial_runs(args: argparse.Namespace, suite: dict, label: str, params: dict) -> list[RunSpec]:
    trial = trial_suite(suite, label, params, args.validation_fraction, args.validation_seed)
    return expand(trial, strategies=[label], datasets=args.datasets, tasks=args.tasks, seeds=args.seeds)


def objective_value(results: list[RunResult], objective: str) -> float:
    """The mean of the runs' validation summary entry (``OBJECTIVES``)."""
    return sum((r.validation_summary or {})[OBJECTIVES[objective]] for r in results) / len(results)


def counted(trials: list) -> int:
    """The trials that spent the budget: finished, or failed by their run's own error."""
    from optuna.trial import TrialState

    return sum(
        t.state == TrialState.COMPLETE or (t.state == TrialState.FAIL and TRIAL_ERROR in t.user_attrs)
        for t in trials
    )


def running(trials: list) -> int:
    """The trials under way in some worker: each holds its place in the budget."""
    from optuna.trial import TrialState

    return sum(t.state == TrialState.RUNNING for t in trials)


def retry_killed_trials(study) -> int:
    """Ask again, with the same values, each trial a killed tune left failed or running: its runs
    resume from their checkpoints in the same folder. Returns how many were asked again."""
    import optuna
    from optuna.trial import TrialState

    optuna.storages.fail_stale_trials(study)  # a worker killed without a word, after its grace period
    trials = study.trials
    settled = {
        params_digest(t.params)
        for t in trials
        if t.state in (TrialState.COMPLETE, TrialState.WAITING, TrialState.RUNNING)
        or TRIAL_ERROR in t.user_attrs
    }
    again = 0
    for trial in trials:
        if trial.state == TrialState.FAIL and params_digest(trial.params) not in settled:
            study.enqueue_trial(trial.params)
            settled.add(params_digest(trial.params))
            again += 1
    return again


def storage_of(args: argparse.Namespace, results_dir: Path):
    import optuna

    url = args.storage or f"sqlite:///{results_dir / 'optuna.sqlite3'}"
    if "://" not in url:
        raise UserError(
            f"--storage {url!r} is no storage URL; give e.g. sqlite:///tune.sqlite3 or postgresql://..."
        )
    results_dir.mkdir(parents=True, exist_ok=True)
    try:  # workers started together would each create the new storage's tables: one does
        with HeartbeatLock(results_dir / ".storage.lock").held(CLAIM_POLL_SECONDS):
            return optuna.storages.RDBStorage(url, heartbeat_interval=60, grace_period=180)
    except Exception as err:  # an unreachable database or a driver that is not installed
        raise UserError(
            f"--storage {url}: cannot open it ({type(err).__name__}: {str(err).splitlines()[0]})"
        ) from None


def worker_name() -> str:
    """This process, as a trial records who ran it: host and pid, and its SLURM job where it has one."""
    job = slurm_job_id()
    return f"{socket.gethostname()}:{os.getpid()}" + (f" (SLURM job {job})" if job else "")


def _sampler(seed: int, trial: int | None = None):
    """The TPE sampler: seeded ``seed``, or for trial ``trial`` with a seed drawn from (``seed``,
    ``trial``) by numpy's ``SeedSequence``. Not ``seed + trial``: NumPy's generators seeded with
    nearby integers can start alike (seeds 0 and 3 draw 0.549 and 0.551 first), and a tune seeded
    so drew its trials 0 and 3 within 1 % of each other."""
    import numpy as np
    import optuna

    if trial is not None:
        seed = int(np.random.SeedSequence([seed, trial]).generate_state(1)[0])
    return optuna.samplers.TPESampler(seed=seed)


def _execute_or_wait(run, store: ResultStore, args, label: str, number: int) -> RunResult:
    """The run's result, computed here or, where another worker holds the run (the same values asked
    by two workers), taken from that worker once it has stored it."""
    said = False
    while True:
        result, status = execute(run, store, args.data_root, show_progress=False)
        if result is not None:
            return result
        if not said and not args.quiet:
            print(f"{label}: trial {number} waits for {run.spec.key}: {status}", file=sys.stderr)
            said = True
        time.sleep(POLL_SECONDS)


def tune_strategy(args, suite, label, dimensions, storage, results_dir) -> Any:
    import optuna

    name = f"{suite['name']}-{label}-{args.objective}"
    study = optuna.create_study(
        study_name=name,
        storage=storage,
        direction="maximize",
        sampler=_sampler(args.sampler_seed),
        load_if_exists=True,
    )
    ours: list[int] = []  # the trials this worker ran

    def objective(trial, claim: HeartbeatLock) -> float:
        claim.release()  # the trial is in the storage now: other workers count it
        ours.append(trial.number)
        # Each trial draws from its own seed, so workers that start together, or a resumed process,
        # never draw alike (a sampler seeded once per process would give each the same draws).
        trial.study.sampler = _sampler(args.sampler_seed, trial.number)
        params = {d.name: d.suggest(trial) for d in dimensions}
        store = ResultStore(results_dir / "trials" / label / params_digest(params))
        trial.set_user_attr("folder", str(store.root))
        trial.set_user_attr("worker", worker_name())
        results = []
        for spec in trial_runs(args, suite, label, params):
            try:
                run = resolve(spec, args.data_root)
                results.append(_execute_or_wait(run, store, args, label, trial.number))
            except UserError as err:  # a value that breaks the run (a diverging loss): a failed trial
                trial.set_user_attr(TRIAL_ERROR, str(err))
                print(f"{label}: trial {trial.number} {params} failed: {err}", file=sys.stderr)
                raise
        value = objective_value(results, args.objective)
        if not args.quiet:
            print(f"{label}: trial {trial.number} {params} -> {args.objective} {value:.2f}", file=sys.stderr)
        return value

    said_waiting = False
    while True:
        # Held while this worker counts the trials and starts one, up to the moment its trial is in
        # the storage: workers sharing the study never start more trials than the budget, nor ask a
        # killed trial again twice.
        with HeartbeatLock(results_dir / f".{name}.claim.lock").held(CLAIM_POLL_SECONDS) as claim:
            if again := retry_killed_trials(study):
                print(f"{label}: {again} killed trial(s) asked again with their values", file=sys.stderr)
            trials = study.trials  # read once: each read asks the storage for every trial
            done, elsewhere = counted(trials), running(trials)
            if done >= args.trials:
                return study
            if done + elsewhere >= args.trials:  # the rest of the budget is under way in other workers
                claim.release()
                if not said_waiting:
                    print(f"{label}: waiting for {elsewhere} trial(s) of other workers", file=sys.stderr)
                    said_waiting = True
                time.sleep(POLL_SECONDS)
                continue
            started = len(ours)
            study.optimize(functools.partial(objective, claim=claim), n_trials=1, catch=(UserError,))
        trial = study.trials[ours[-1]] if len(ours) > started else None
        if trial is not None and trial.state.name == "FAIL" and TRIAL_ERROR not in trial.user_attrs:
            raise UserError(f"{label}: trial {trial.number} did not finish (the line above says why)")


def best_params(study) -> tuple[Any, dict[str, Any]]:
    from optuna.trial import TrialState

    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    if not complete:
        raise UserError(
            f"study {study.study_name}: no trial finished (every one failed); widen or move the space"
        )
    best = max(complete, key=lambda t: (t.value, -t.number))
    return best, best.params


def trial_table(study) -> list[dict[str, Any]]:
    rows = []
    for t in study.trials:
        row = {"number": t.number, "state": t.state.name, "params": t.params}
        if t.value is not None:
            row["value"] = t.value
        if TRIAL_ERROR in t.user_attrs:
            row["error"] = t.user_attrs[TRIAL_ERROR]
        rows.append(row)
    return rows


def tuned_suite(args, suite: dict, studies: dict[str, Any], space: dict[str, list[Dimension]]) -> dict:
    """The suite as given, plus each tuned label's ``<label>-tuned`` variant (its best values over its
    own tables) and its ``[tuned.<label>-tuned]`` provenance; no validation split: these rows train on
    every training image and are scored on the test set."""
    out = {k: copy.deepcopy(v) for k, v in suite.items() if k not in TUNING_ONLY_KEYS}
    out["description"] = f"{suite.get('description', suite['name'])} (tuned by benchmarks.tune)"
    labels, variants, tuned = [], out.setdefault("variants", {}), out.setdefault("tuned", {})
    for label, study in studies.items():
        best, params = best_params(study)
        name = label + TUNED_SUFFIX
        base = copy.deepcopy(suite.get("variants", {}).get(label, {"strategy": label}))
        variants[name] = {**base, **params}
        tuned[name] = {
            "strategy": label,
            "study": study.study_name,
            "objective": args.objective,
            "trials": args.trials,
            "sampler": "TPESampler",
            "sampler_seed": args.sampler_seed,  # with each trial's number (_sampler)
            "validation_fraction": args.validation_fraction,
            "validation_seed": args.validation_seed,
            "space": {d.name: d.record() for d in space[label]},
            "best_trial": best.number,
            "best_value": best.value,
            "trial_table": trial_table(study),
        }
        labels += [label, name]
    out["strategies"] = labels
    return out


# --- a suite as TOML (plain data: strings, numbers, booleans, lists and tables) -------------------


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return repr(value)
    if isinstance(value, (int, str)):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items() if v is not None) + "}"
    raise TypeError(f"no TOML value for {value!r}")


def suite_toml(suite: dict[str, Any], header: str) -> str:
    """``suite`` as a TOML file: plain keys first, then one table per nested table (two levels)."""
    lines = [f"# {line}" for line in header.splitlines()]
    tables = []
    for key, value in suite.items():
        if isinstance(value, dict):
            tables.append((key, value))
        elif value is not None:
            lines.append(f"{_key(key)} = {_value(value)}")
    for key, value in tables:
        nested = {k: v for k, v in value.items() if isinstance(v, dict)}
        plain = {k: v for k, v in value.items() if k not in nested}
        if plain or not nested:
            lines += ["", f"[{_key(key)}]"] + [
                f"{_key(k)} = {_value(v)}" for k, v in plain.items() if v is not None
            ]
        for name, table in nested.items():
            lines += ["", f"[{_key(key)}.{_key(name)}]"]
            lines += [f"{_key(k)} = {_value(v)}" for k, v in table.items() if v is not None]
    return "\n".join(lines) + "\n"


def run_tune(
    args: argparse.Namespace, argv: list[str] | None, suite: dict[str, Any], tables: dict[str, dict]
) -> int:
    """The tune ``benchmarks.tune``'s parsed ``args`` ask for, of ``suite`` (loaded, its names and
    validation split checked) over the search space's ``tables`` (``tune_space.space_tables``);
    ``argv``: the command line, for the tuned suite's header."""
    prepare_runner_process()
    import optuna

    # one line per trial is ours; Optuna's would add a traceback for a trial stopped by a kill
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    # the heartbeat that fails a killed worker's trials is marked experimental
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    sigterm = stop_on_sigterm()
    try:
        space = read_space(args.space, tables, suite)
        results_dir = Path(args.results_dir or Path("runs") / "tune" / suite["name"])
        for label in args.strategies:  # every mistake before the first trial: the ends of each range
            lows = {d.name: d.choices[0] if d.choices else d.low for d in space[label]}
            preflight(trial_runs(args, suite, label, lows), args.data_root)
        storage = storage_of(args, results_dir)
        studies = {
            label: tune_strategy(args, suite, label, space[label], storage, results_dir)
            for label in args.strategies
        }
        out = Path(args.out or results_dir / "tuned.toml")
        header = (
            f"Tuned by python -m benchmarks.tune {' '.join(argv if argv is not None else sys.argv[1:])}\n"
            f"on a validation split ({args.validation_fraction:g} of each class's training images, seed "
            f"{args.validation_seed}); the test set was never read. Run it on the test set with\n"
            f"python -m benchmarks.run --suite {out}"
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(out, suite_toml(tuned_suite(args, suite, studies, space), header).encode())
        load_suite(str(out))  # the file written runs: checked as the runner will read it
        for label, study in studies.items():
            best, params = best_params(study)
            print(f"{label}: best {args.objective} {best.value:.2f} (trial {best.number}) with {params}")
        print(f"tuned suite: {out}; run it on the test set with python -m benchmarks.run --suite {out}")
        return 0
    except KeyboardInterrupt:
        print("stopped; rerun the same command to resume the tune", file=sys.stderr)
        return 130
    finally:
        restore_sigterm(sigterm)
