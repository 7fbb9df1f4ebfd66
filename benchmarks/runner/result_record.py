"""What a result is: the schema of a finished run (``RunResult``, with ``StageResult`` and
``RunCost``), its config hash and digest, and whether a JSON value read from a result's path is one
this suite reads (``unreadable_result``). Where results lie, and reading them back, is the store's
(``benchmarks.runner.results``).

``schema_version`` 2 added the predictions sidecar, 3 forgetting and backward transfer in the
summary, 4 the ``digest`` of the stages and summary, 5 ``cost.resumed_from``; versions 1 to 4 still
load everywhere, their summaries completed from their stages (``with_complete_summary``).
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from dataclasses import dataclass, fields
from typing import ClassVar, NamedTuple

import numpy as np

from benchmarks.core.json_record import JsonRecord, optional_field, required
from benchmarks.core.metrics import average_forgetting, backward_transfer, summarize, task_accuracy_matrix
from benchmarks.runner.run_key import RunKey, key_of_config

SCHEMA_VERSION = 5
# version 1: no predictions sidecar; 1 and 2: no forgetting or bwt in the summary (computed on
# reading); 1 to 3: no digest (read unchecked)
READABLE_SCHEMA_VERSIONS = (1, 2, 3, 4, 5)
DIGEST_SINCE = 4  # the first version whose results carry, and are checked against, a digest


@dataclass
class StageResult(JsonRecord):
    """The test after learning one task (metrics of docs/decisions.md P1)."""

    task: int  # 1-based
    acc: float  # % top-1 over the test images of all seen classes
    acc_per_task: list[float]  # % on each learned task's test images
    n_test_per_task: list[int]
    routing_acc: float  # % of images whose predicted class lies in their true task
    auroc: float | None  # % seen-versus-future detection by the maximum softmax; None at stage T
    fpr95: float | None
    diagnostics: dict  # per stage, documented by the strategy
    #: the same metrics on the validation split held out of the training images (config.validation);
    #: absent without one
    validation: dict | None = optional_field()


@dataclass
class RunCost(JsonRecord):
    """What a run cost; the first four are summed across resumes while it runs."""

    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    peak_memory_bytes: int = 0  # the largest over the run, across resumes
    train_steps: int | None = optional_field()  # the tasks' own training iterations (absent in older files)
    trainable_params: int | None = optional_field()  # as the strategy counts them
    #: "cuda_allocated", "cpu_run_peak_rss" (the run's own peak) or "cpu_process_peak_rss" (the
    #: process's; "cpu_max_rss" in version 1)
    peak_memory_kind: str | None = optional_field()
    amp_skipped_steps: int | None = optional_field()  # fp16 steps the loss scaler skipped
    #: the tasks done at each resume: [] uninterrupted, [2] resumed once after task 2, [0] a
    #: checkpoint set aside and the run started again from task 1 (from version 5)
    resumed_from: list[int] | None = optional_field()


@dataclass(kw_only=True)
class RunResult(JsonRecord):
    """A finished run, as stored in ``<dataset>/<label>/T<n>-seed<s>.json``."""

    RECORD_FIELDS: ClassVar[dict[str, type]] = {"stages": StageResult, "cost": RunCost}

    schema_version: int  # bumped on any change of the layout
    strategy: str  # the registry name, or module:Class
    label: str  # the row name in tables: the strategy or a suite variant
    dataset: str
    n_tasks: int
    seed: int
    #: fully resolved: backbone, dataset options, every strategy option, class-order name, device,
    #: precision, deterministic, option_sources (not hashed)
    config: dict
    config_hash: str | None = optional_field()  # ``config_hash(config)``
    class_order: list[int]  # the class permutation of the stream
    class_names: list[str] | None = optional_field()  # indexed by class id
    tasks: list[list[int]]  # the class ids of each task
    stages: list[StageResult]  # one per task, in order
    summary: dict  # avg_acc, last_acc, avg_auroc, last_auroc, forgetting, bwt (the last two from version 3)
    #: ``result_digest`` of the stages and summary as written (from version 4): ties one to the other
    digest: str | None = optional_field()
    #: ``summarize`` of the stages' validation metrics; absent without a validation split
    validation_summary: dict | None = optional_field()
    diagnostics: dict | None = optional_field()  # run-level, documented by the strategy
    zero_shot: dict | None = optional_field()  # per zero-shot target: each predictor's accuracy, n_test
    env: dict  # versions, device, git commit, host, start time
    cost: RunCost
    predictions: dict | None = optional_field()  # the sidecar's file, sha256, n_stages, n_images, dtype

    @property
    def key(self) -> "RunKey":
        """Its place in the store; the record's own fields first, as a result made by hand may
        hold a config without them (no class order: the default one)."""
        own = {"strategy": self.strategy, "dataset": self.dataset, "n_tasks": self.n_tasks, "seed": self.seed}
        return key_of_config(self.label, {**self.config, **own})


#: the keys every stored result has, whatever its version
REQUIRED_KEYS = tuple(f.name for f in fields(RunResult) if required(f))


#: config entries that record, not determine: left out of the hash. ``augment_on``: the device and
#: PIL paths give the same pixels (tests/data/test_device_augment.py), so either's result serves.
#: ``weights_file``: the name and SHA-256 of the weight file loaded, which ``backbone`` names already.
UNHASHED_CONFIG_KEYS = ("option_sources", "augment_on", "weights_file")


def config_hash(config: dict) -> str:
    """A stable hash of a resolved config (key order does not matter; ``UNHASHED_CONFIG_KEYS`` left out)."""
    blob = json.dumps(
        {k: v for k, v in config.items() if k not in UNHASHED_CONFIG_KEYS},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def result_digest(stages: list, summary: dict | None) -> str:
    """The SHA-256 of the canonical JSON of a result's ``stages`` and ``summary`` (keys sorted, no
    spaces), stored beside them: a summary edited by hand no longer matches its stages' digest."""
    blob = json.dumps(
        {"stages": stages, "summary": summary}, sort_keys=True, separators=(",", ":"), allow_nan=False
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def _json_kind(value) -> str:
    kinds = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


def _agree(stored, computed) -> bool:
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (stored, computed))
    return stored == computed or (numbers and math.isclose(stored, computed))


def _entry_disagreement(summary, stages, what: str) -> str | None:
    """The first entry of ``summary`` that disagrees with ``summarize(stages)``, in words; None
    where each agrees. An entry the stages do not give (forgetting where they hold no per-task
    accuracies, as in records made by hand; an entry of the file's own) is not checked."""
    if not isinstance(summary, dict) or not stages:
        return None
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):  # all-NaN slices of a bare record
            warnings.simplefilter("ignore", RuntimeWarning)
            computed = summarize(stages)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):  # stages out of shape
        return None
    for name, stored in summary.items():
        if computed.get(name) is not None and not _agree(stored, computed[name]):
            return f"its {what}'s {name} {stored!r} disagrees with its stages ({computed[name]!r})"
    return None


def summary_disagreement(data: dict) -> str | None:
    """Which entry of a result's ``summary`` (or ``validation_summary``) disagrees with the one its
    stages give (``summarize``), in words; None where all agree. Checked whatever the schema
    version: the digest binds a summary only in the files that keep it."""
    stages = data.get("stages")
    if (why := _entry_disagreement(data.get("summary"), stages, "summary")) is not None:
        return why
    if isinstance(stages, list) and all(isinstance(s, dict) and s.get("validation") for s in stages):
        validation = [stage["validation"] for stage in stages]
        return _entry_disagreement(data.get("validation_summary"), validation, "validation summary")
    return None


def config_disagreement(data: dict) -> str | None:
    """Why a result's ``config`` is not the one its ``config_hash`` names, in words; None where it
    is (or where the file keeps no hash, as records made by hand may not)."""
    stored, config = data.get("config_hash"), data.get("config")
    if stored is None or not isinstance(config, dict):
        return None
    try:
        computed = config_hash(config)
    except (TypeError, ValueError):  # a value JSON cannot hold canonically
        computed = None
    if computed == stored:
        return None
    return (
        f"its config changed after the run wrote it (its config_hash is {stored!r}, its config's "
        f"{computed!r}), so it cannot tell which config computed it"
    )


def stored_key(data: dict) -> RunKey | None:
    """The run key a result's own fields give (``RunResult.key``); None where they give none (a
    record made by hand without a config, say)."""
    try:
        own = {name: data[name] for name in ("strategy", "dataset", "n_tasks", "seed")}
        return key_of_config(data["label"], {**data["config"], **own})
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


class ResultProblem(NamedTuple):
    """Why a JSON value at a result's path is no result to read (``why``, words that follow its
    path), and whether a rerun with ``--force`` may replace it (``replaceable``): never a result
    of a schema this suite cannot read, which a newer suite wrote."""

    why: str
    replaceable: bool


def unreadable_result(data) -> ResultProblem | None:
    """Why ``data``, read from a result's path, is no result that this suite reads; None if it is
    one. A result of version 4 on with a ``digest`` must match it; whatever its version, its summary
    must agree with its stages (``summary_disagreement``) and its config with its ``config_hash``
    (``config_disagreement``), and ``RunResult`` must read it whole. Where it lies is checked by
    ``misplacement``, which needs the path."""
    if not isinstance(data, dict):
        return ResultProblem(f"not a result (a JSON {_json_kind(data)}, not an object)", True)
    missing = [name for name in ("schema_version", "stages") if name not in data]
    if missing:
        return ResultProblem(f"not a result (no {', '.join(missing)})", True)
    version = data["schema_version"]
    if version not in READABLE_SCHEMA_VERSIONS:
        newer = type(version) is int and version > SCHEMA_VERSION
        relation = ", newer than" if newer else ", not one of"
        return ResultProblem(
            f"schema_version {version!r}{relation} the versions this suite reads "
            f"({', '.join(map(str, READABLE_SCHEMA_VERSIONS))})"
            + ("; read it with the clip-cil-bench that wrote it" if newer else ""),
            False,
        )
    digest = data.get("digest")
    if digest is not None and version >= DIGEST_SINCE:  # an older file is read as its version was
        try:
            agrees = digest == result_digest(data["stages"], data.get("summary"))
        except (TypeError, ValueError):  # a value JSON cannot hold canonically (NaN by hand)
            agrees = False
        if not agrees:
            changed = (
                "its stages or summary changed after the run wrote them (their digest is not the stored one)"
            )
            return ResultProblem(summary_disagreement(data) or changed, True)
    if (why := summary_disagreement(data) or config_disagreement(data)) is not None:
        return ResultProblem(why, True)
    try:  # what every reader reads it as
        RunResult.from_json(data)
    except (TypeError, ValueError) as err:  # a key missing or unknown, here or in a stage or the cost
        return ResultProblem(f"not a complete result ({err})", True)
    return None


def changed_entries(old: dict, new: dict, limit: int = 4) -> list[str]:
    """The hashed config entries that differ between two resolved configs, one level into dicts
    (``strategy_config.eval_batch_size``); at most ``limit`` named, then how many more."""
    changed = []
    for name in sorted((set(old) | set(new)) - set(UNHASHED_CONFIG_KEYS)):
        a, b = old.get(name), new.get(name)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            changed += [f"{name}.{k}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        else:
            changed.append(name)
    return changed[:limit] + ([f"{len(changed) - limit} more"] if len(changed) > limit else [])


#: summary entries that results written before schema version 3 lack, and how each is computed
#: from the stored per-task accuracies
SUMMARY_FROM_STAGES = {"forgetting": average_forgetting, "bwt": backward_transfer}


def with_complete_summary(result: dict) -> dict:
    """``result`` with every ``SUMMARY_FROM_STAGES`` entry in its summary: a result of an older
    schema version gets them computed from its stages, as the runner computes them now (None with
    one task); a result that has them is returned as it is."""
    summary = result.get("summary")
    if not isinstance(summary, dict) or all(name in summary for name in SUMMARY_FROM_STAGES):
        return result
    stages = result.get("stages") or []
    if stages and all(stage.get("acc_per_task") for stage in stages):
        acc_matrix = task_accuracy_matrix(stages)
        computed = {name: float(metric(acc_matrix)) for name, metric in SUMMARY_FROM_STAGES.items()}
    else:  # hand-made records may leave the per-task accuracies out
        computed = dict.fromkeys(SUMMARY_FROM_STAGES, math.nan)
    numbers: dict[str, float | None] = {n: None if math.isnan(v) else v for n, v in computed.items()}
    missing = {name: value for name, value in numbers.items() if name not in summary}
    return {**result, "summary": {**summary, **missing}}
