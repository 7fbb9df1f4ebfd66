"""The results store: one versioned JSON file per run, written atomically.

Layout under a results directory (``<stem>``: ``RunKey.stem``, ``T10-seed0``, ``B50-Inc10-T6-seed0``
or ``T10-seed0-order-seed5``; ``benchmarks.runner.run_key``)::

    <dataset>/<label>/<stem>.json                       finished runs (schema below)
    <dataset>/<label>/<stem>.predictions.safetensors    their per-image predictions
    .checkpoints/<dataset>/<label>/<stem>/              state of an unfinished run
    .locks/<dataset>/<label>/<stem>.lock                held while a process computes the run
    .locks/<dataset>/<label>/<stem>.error               why its last attempt failed

A run is identified by its *label* (the strategy name, or a variant name from the suite), dataset,
number of tasks (and half-base split), seed and, where it is not its protocol's default, class order.
Its folder is ``safe_label(label)``: a ``module:Class`` strategy's folder
has ``_`` for the colon; the JSON keeps the label itself. Its resolved config is hashed; a finished
file whose hash matches is never recomputed unless the user asks (``--force``).

The schema of a finished run is ``RunResult`` below, with ``StageResult`` and ``RunCost``: each
field is commented where it is defined, and ``docs/results-schema.md`` (tested against these
fields) explains it. ``schema_version`` 2 added the predictions sidecar, 3 forgetting and backward
transfer in the summary, 4 the ``digest`` of the stages and summary, 5 ``cost.resumed_from``;
versions 1 to 4 still load everywhere, their summaries completed from their stages
(``with_complete_summary``).
``benchmarks.runner.reading`` reads them back as these records.

A finished result is never replaced unsaid (``ResultStore.refusal``): not one of a newer schema,
not one of another label that shares the folder, not one of another config without ``--force``.
A file at a result's path that is no result, or whose digest disagrees with its stages and
summary, is named by every reader and left out (``unreadable_result``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, NamedTuple

import numpy as np
import torch
from safetensors import SafetensorError

from benchmarks.core.atomic_io import atomic_write_bytes, read_json, read_tensors, write_json, write_tensors
from benchmarks.core.errors import UserError
from benchmarks.core.json_record import JsonRecord, optional_field, required
from benchmarks.core.metrics import average_forgetting, backward_transfer, summarize, task_accuracy_matrix

# the key and file names live in run_key (no torch); imported from here too, as they always were
from benchmarks.runner.run_key import RESULT_NAME as RESULT_NAME
from benchmarks.runner.run_key import RUN_STEM as RUN_STEM
from benchmarks.runner.run_key import RunKey, key_of_config, safe_label
from benchmarks.runner.run_key import default_class_order as default_class_order

if TYPE_CHECKING:
    from benchmarks.runner.locking import RunLock

SCHEMA_VERSION = 5
# version 1: no predictions sidecar; 1 and 2: no forgetting or bwt in the summary (computed on
# reading); 1 to 3: no digest (read unchecked)
READABLE_SCHEMA_VERSIONS = (1, 2, 3, 4, 5)
DIGEST_SINCE = 4  # the first version whose results carry, and are checked against, a digest
PREDICTIONS_SUFFIX = ".predictions.safetensors"
CHECKPOINT_STATE = "state.json"  # the JSON half of a checkpoint, written after its tensors
PREDICTIONS_KEY = "runner/predictions"  # the predictions so far, among a checkpoint's tensors


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


def misplacement(data: dict, path: Path) -> str | None:
    """Why a result at ``path`` holds another run than its place in a results folder names (a label,
    seed or dataset edited, or the file moved by hand), in words; None where it lies in its place."""
    key = stored_key(data)
    if key is None:
        return None
    place = key.relpath.with_suffix(".json").parts
    if tuple(Path(path).parts[-len(place) :]) == place:
        return None
    return f"it holds the run {key}, whose place is {Path(*place)}: it was moved or edited by hand"


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


def iter_results(root: str | Path, skipped: list[str] | None = None) -> Iterator[tuple[Path, dict]]:
    """Every finished result JSON under ``root`` (checkpoints and other JSON files are skipped).

    A file that is no result this suite reads (``unreadable_result``: another ``schema_version``,
    a digest that disagrees with its stages and summary, or, at a result's name, no result at all,
    such as ``[]``) is skipped too, with a line naming the file: appended to ``skipped`` where
    given, else a warning. Older readable versions come with their summary completed
    (``with_complete_summary``).
    """
    root = Path(root)
    paths = []
    for folder, subfolders, files in os.walk(root):  # unreadable or vanishing folders are skipped
        subfolders[:] = [d for d in subfolders if not d.startswith(".")]  # .checkpoints, .locks, .logs
        paths += [Path(folder) / name for name in files if name.endswith(".json")]
    for path in sorted(paths):
        at_a_result_name = RESULT_NAME.fullmatch(path.name) is not None
        line = None
        try:
            data = read_json(path)
        except FileNotFoundError:  # removed by another runner meanwhile
            continue
        except UserError as err:  # corrupt: named, and the walk goes on, so one pass names every bad file
            line = f"skipped {err}" if at_a_result_name else None
        except OSError as err:
            line = f"skipped {path}: it cannot be read ({err.strerror}); fix its permissions or move it away"
        else:
            looks_like_one = isinstance(data, dict) and "schema_version" in data and "stages" in data
            if not looks_like_one and not at_a_result_name:
                continue  # another JSON file (a saved model's, a tool's), not a result
            if (problem := unreadable_result(data)) is not None:
                fix = "rerun that run with --force, or move the file away"
                fix = fix if problem.replaceable else "rerun that run or convert the file"
                line = f"skipped {path}: {problem.why}; {fix}"
            elif (why := misplacement(data, path)) is not None:
                line = f"skipped {path}: {why}; move it to its place under a results folder, or away"
            else:
                yield path, with_complete_summary(data)
                continue
        if line is not None:
            skipped.append(line) if skipped is not None else warnings.warn(line, stacklevel=2)


class ResultStore:
    """Finished results and in-progress checkpoints under one directory."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():
            raise UserError(
                f"--results-dir {self.root} is a file, not a folder; give a folder (it is created if missing)"
            )
        for parent in self.root.parents:
            if parent.exists() and not parent.is_dir():
                raise UserError(
                    f"--results-dir {self.root} lies under {parent}, which is a file; give a folder"
                )

    def result_path(self, key: RunKey) -> Path:
        return self.root / key.relpath.with_suffix(".json")

    def checkpoint_dir(self, key: RunKey) -> Path:
        return self.root / ".checkpoints" / key.relpath

    def lock(self, key: RunKey) -> "RunLock":
        """The run's lock (``benchmarks.runner.locking``): one process computes a run at a time."""
        from benchmarks.runner.locking import RunLock

        return RunLock(self.root / ".locks" / key.relpath.with_suffix(".lock"))

    def checkpoint_state_path(self, key: RunKey) -> Path:
        """The JSON half of a run's checkpoint (progress, stages, cost), written last."""
        return self.checkpoint_dir(key) / CHECKPOINT_STATE

    def finished(self, key: RunKey, cfg_hash: str | None) -> RunResult | None:
        """The stored result of ``key`` if it exists and was made with the same config (with
        ``cfg_hash`` None: with any config), as the record every reader reads. A result of an older
        readable schema version counts as finished (the config hash does not hold the version), its
        summary completed (``with_complete_summary``)."""
        path = self.result_path(key)
        if not path.exists():
            return None
        result = read_json(path)
        if unreadable_result(result) is not None or cfg_hash not in (None, result.get("config_hash")):
            return None
        if misplacement(result, path) is not None:  # another run's result, moved or edited by hand
            return None
        return RunResult.from_json(with_complete_summary(result))

    def finished_elsewhere(
        self, key: RunKey, cfg_hash: str, sources: Sequence[str | Path]
    ) -> Iterator[tuple[ResultStore, RunResult]]:
        """Each other results folder of ``sources`` holding a finished result of ``key`` made with
        config ``cfg_hash``, with that result (``finished``), in the order given."""
        for source in sources:
            other = ResultStore(source)
            if other.root.resolve() != self.root.resolve() and (result := other.finished(key, cfg_hash)):
                yield other, result

    def reuse(
        self, key: RunKey, cfg_hash: str, sources: Sequence[str | Path]
    ) -> tuple[RunResult, Path] | None:
        """The first finished result of ``key`` with config ``cfg_hash`` in another results folder
        of ``sources`` (a suite's base folder, a shared store; ``finished_elsewhere``), copied here
        as it is stored: its predictions sidecar first, checked against the SHA-256 the result
        names, then the JSON. The result and the folder it came from; None where no source holds
        one (a damaged sidecar does not count: the run is computed instead)."""
        for other, result in self.finished_elsewhere(key, cfg_hash, sources):
            entry = result.predictions
            try:
                stored = other.result_path(key).read_bytes()
                sidecar = (other.result_path(key).parent / entry["file"]).read_bytes() if entry else None
            except OSError:
                continue
            if entry and sidecar is not None:
                if hashlib.sha256(sidecar).hexdigest() != entry["sha256"]:
                    continue
                atomic_write_bytes(self.result_path(key).parent / entry["file"], sidecar)
            atomic_write_bytes(self.result_path(key), stored)
            return result, other.root
        return None

    def refusal(
        self, key: RunKey, cfg_hash: str | None, force: bool = False, config: dict | None = None
    ) -> str | None:
        """Why computing ``key`` now would replace its stored result unsaid, in one line; None
        where nothing is stored, the stored result is this run's and config's (it is cached), or
        ``force`` may replace it. Refused whatever ``force`` says: a result of a schema this suite
        cannot read (a newer suite's), and a result of another label whose folder this run's label
        shares (``mymod:ZeroShot`` and a variant ``mymod_ZeroShot``, across two commands). Refused
        without ``force``: a file that is no result or fails its checks (``unreadable_result``), a
        corrupt JSON file, another run's result (``misplacement``), and a result of another config
        (``cfg_hash`` None: any config is this run's; ``config``, the run's resolved config, names
        what changed)."""
        path = self.result_path(key)
        try:
            data = read_json(path)
        except FileNotFoundError:
            return None
        except UserError as err:  # corrupt JSON: read_json's line names it
            return None if force else str(err)
        except OSError as err:
            return f"result file {path} cannot be read ({err.strerror}); fix its permissions or move it away"
        if (problem := unreadable_result(data)) is not None:
            if problem.replaceable and force:
                return None
            fix = (
                "rerun with --force to recompute it, or move it away"
                if problem.replaceable
                else ("move it away to recompute the run here, or give another --results-dir")
            )
            return f"result file {path}: {problem.why}; {fix}"
        label = data.get("label")
        shares_folder = label != key.label and safe_label(str(label)) == safe_label(key.label)
        if not shares_folder and (why := misplacement(data, path)) is not None:
            return (
                None
                if force
                else f"result file {path}: {why}; rerun with --force to replace it, or move it away"
            )
        if label != key.label:
            return (
                f"result file {path} holds the run {data.get('label')!r}, whose folder "
                f"{safe_label(key.label)!r} the run {key.label!r} shares: one would replace the other; "
                "rename one of them (a variant's label), or give another --results-dir"
            )
        stored = data.get("config_hash")
        if cfg_hash is None or force or stored == cfg_hash:
            return None
        changed = changed_entries(data.get("config") or {}, config) if config is not None else []
        what = f"; changed: {', '.join(changed)}" if changed else ""
        return (
            f"result file {path} was computed with another config (hash {stored}, this run's {cfg_hash}"
            f"{what}); rerun with --force to replace it, or give another --results-dir to keep both"
        )

    # ------------------------------------------------------------ the layout, read back
    # What the tools see of the store comes from here, so a change of layout stays in this class,
    # its reader (benchmarks.runner.reading) and docs/results-schema.md.
    def _key_at(self, relative: Path) -> RunKey | None:
        """The run of ``<dataset>/<label>/<RunKey.stem>[.suffix]`` (None for another path); its label
        is the folder's (``safe_label``)."""
        if len(relative.parts) != 3 or relative.parts[0].startswith("."):
            return None
        dataset, label, name = relative.parts
        return RunKey.from_stem(label, dataset, name.split(".")[0])

    def result_files(self) -> list[tuple[RunKey, Path]]:
        """Every file at a result's place (``<dataset>/<label>/<stem>.json``), with its run, whatever
        it holds: ``finished`` and ``results`` check what each one holds."""
        found = []
        for path in sorted(self.root.glob("*/*/*.json")):  # nothing where the folder does not exist
            if RESULT_NAME.fullmatch(path.name) and (key := self._key_at(path.relative_to(self.root))):
                found.append((key, path))
        return found

    def results(self, skipped: list[str] | None = None) -> Iterator[tuple[Path, RunResult]]:
        """Every result under the store that its checks pass, as the record every reader reads
        (``iter_results``: the others named in ``skipped``, else warned about)."""
        for path, data in iter_results(self.root, skipped):
            yield path, RunResult.from_json(data)

    def checkpoint_states(self) -> list[tuple[RunKey, Path]]:
        """Each checkpoint's state file (its JSON half, written last), with its run."""
        folder = self.root / ".checkpoints"
        found = []
        for path in sorted(folder.glob(f"*/*/*/{CHECKPOINT_STATE}")):
            if (key := self._key_at(path.parent.relative_to(folder))) is not None:
                found.append((key, path))
        return found

    def run_keys(self) -> set[RunKey]:
        """Every run of which the store holds something: a result file, a checkpoint, a lock, an error
        or a queued record (labels as their folders spell them: ``safe_label``)."""
        keys = {key for key, _ in [*self.result_files(), *self.checkpoint_states()]}
        locks = self.root / ".locks"
        for suffix in (".lock", ".error", ".queued"):  # RunLock's files
            for path in locks.glob(f"*/*/*{suffix}"):
                if (key := self._key_at(path.relative_to(locks))) is not None:
                    keys.add(key)
        return keys

    def leftovers(self) -> list[Path]:
        """What a store whose every run ended, and ended cleanly, does not hold: temporary files of
        interrupted writes (``benchmarks.core.atomic_io``), locks, and checkpoints."""
        return sorted(
            path
            for path in self.root.rglob("*")
            if path.is_file()
            and (path.name.endswith(".tmp") or path.suffix == ".lock" or ".checkpoints" in path.parts)
        )

    def clear_checkpoint(self, key: RunKey) -> None:
        """Remove a run's checkpoint and the folders it leaves empty."""
        directory = self.checkpoint_dir(key)
        shutil.rmtree(directory, ignore_errors=True)
        for parent in directory.parents:
            if parent == self.root:
                break
            try:  # rmdir removes only an empty folder, atomically: safe beside other runners
                parent.rmdir()
            except OSError:
                break

    def save(
        self, key: RunKey, result: RunResult | dict, predictions: "Predictions | None" = None
    ) -> RunResult:
        """Store a finished run: its predictions sidecar first, then the JSON that names it and
        its digest, so that a JSON on disk always finds the sidecar it was written with. A dict is
        checked against ``RunResult`` (``ValueError`` names missing or unknown keys). Returns the
        record as stored."""
        record = RunResult.from_json(result) if isinstance(result, dict) else result
        path = self.result_path(key)
        if predictions is not None:
            record = replace(record, predictions=save_predictions(predictions_path(path), predictions))
        as_json = record.to_json()
        record = replace(record, digest=result_digest(as_json["stages"], as_json["summary"]))
        write_json(path, record.to_json())
        return record

    def save_checkpoint(
        self,
        key: RunKey,
        progress: "RunProgress",
        strategy_tensors: dict[str, torch.Tensor],
        strategy_meta: dict,
        cfg_hash: str,
    ) -> None:
        """The run after ``progress.tasks_done`` tasks. Tensors (the strategy's and the predictions
        so far) go to ``task-NN.safetensors``; ``state.json`` is written last and names that file,
        so a run killed at any moment leaves the previous complete checkpoint in place."""
        directory = self.checkpoint_dir(key)
        for attempt in range(3):  # another runner may remove an empty parent folder meanwhile
            try:
                directory.mkdir(parents=True, exist_ok=True)
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
        predictions = torch.from_numpy(np.stack(progress.predictions).astype(np.int32))
        tensor_file = f"task-{progress.tasks_done:02d}.safetensors"
        write_tensors(directory / tensor_file, {**strategy_tensors, PREDICTIONS_KEY: predictions})
        write_json(
            directory / CHECKPOINT_STATE,
            {
                "config_hash": cfg_hash,
                "tasks_done": progress.tasks_done,
                "tensor_file": tensor_file,
                "strategy": strategy_meta,
                "stages": [stage.to_json() for stage in progress.stages],
                "cost": progress.cost.to_json(),
            },
        )
        for old in directory.glob("task-*.safetensors"):
            if old.name != tensor_file:
                old.unlink()

    def load_checkpoint(
        self, key: RunKey, cfg_hash: str
    ) -> tuple["RunProgress", dict[str, torch.Tensor], dict] | None:
        """The run's last checkpoint as (progress, the strategy's tensors, its metadata), or None to
        start the run over: none exists, the config changed, it predates stored predictions, or its
        files are damaged (a full disk, a lost network write), which is said in a warning."""
        directory = self.checkpoint_dir(key)
        state_path = directory / CHECKPOINT_STATE
        if not state_path.exists():
            return None
        try:
            state = json.loads(state_path.read_bytes().decode("utf-8"))
            if not isinstance(state, dict):  # "[]", a string: no checkpoint of ours
                raise ValueError(f"state.json holds a JSON {type(state).__name__}, not an object")
            if state.get("config_hash") != cfg_hash:
                return None  # the config changed: start over
            tensors = read_tensors(directory / state["tensor_file"])
            if PREDICTIONS_KEY not in tensors:
                return None  # written before predictions were stored: start over to have them
            progress = RunProgress(
                stages=[StageResult.from_json(stage) for stage in state["stages"]],
                cost=RunCost.from_json(state["cost"]),
                predictions=list(tensors.pop(PREDICTIONS_KEY).numpy().astype(np.int64)),
            )
        # JSONDecodeError and UnicodeDecodeError are ValueErrors; TypeError: an entry of the wrong kind
        except (OSError, ValueError, KeyError, TypeError, SafetensorError) as err:
            warnings.warn(
                f"{key}: its checkpoint in {directory} is damaged "
                f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'unreadable'}); "
                "starting the run over",
                stacklevel=2,
            )
            return None
        return progress, tensors, state["strategy"]


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


@dataclass
class RunProgress:
    """A run between tasks: what its checkpoint carries besides the strategy's own state."""

    stages: list[StageResult] = field(default_factory=list)
    cost: RunCost = field(default_factory=RunCost)
    predictions: list[np.ndarray] = field(default_factory=list)  # per stage: each test image's class

    @property
    def tasks_done(self) -> int:
        return len(self.stages)


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


@dataclass(frozen=True)
class Predictions:
    """Every test image's predicted class after each task, with the true classes (the sidecar)."""

    predictions: np.ndarray  # [n_stages, n_images] class ids
    targets: np.ndarray  # [n_images]
    image_ids: np.ndarray  # [n_images] index in the test split

    def correct(self) -> np.ndarray:
        """``[n_stages, n_images]`` booleans: predicted class == true class."""
        return self.predictions == self.targets[None, :]


def reuse_under_lock(
    store: ResultStore, key: RunKey, cfg_hash: str, sources: tuple[str, ...]
) -> tuple[RunResult, Path] | None:
    """``ResultStore.reuse`` under the run's lock, for a launcher that copies before any worker
    starts; None also where another process holds the run."""
    if not sources:
        return None
    lock = store.lock(key)
    if not lock.acquire():
        return None
    found = None
    try:
        found = store.reuse(key, cfg_hash, sources)
    finally:
        lock.release(finished=found is not None)
    return found


def reused_status(source) -> str:
    """What a run copied from another results folder says (``ResultStore.reuse``)."""
    return f"reused from {source} (a finished result of the same config; not recomputed)"


def predictions_path(result_path: Path) -> Path:
    """``T10-seed0.json`` -> ``T10-seed0.predictions.safetensors``."""
    return Path(result_path).with_suffix(PREDICTIONS_SUFFIX)


def _class_dtype(*arrays: np.ndarray) -> np.dtype:
    top = max((int(a.max()) for a in arrays if a.size), default=0)
    return np.dtype(np.uint16) if top <= np.iinfo(np.uint16).max else np.dtype(np.uint32)


def save_predictions(path: Path, predictions: Predictions) -> dict:
    """Write the sidecar atomically (a temporary file, then a rename); return its JSON entry."""
    from safetensors.numpy import save

    dtype = _class_dtype(predictions.predictions, predictions.targets)
    blob = save(
        {
            "predictions": np.ascontiguousarray(predictions.predictions, dtype=dtype),
            "targets": np.ascontiguousarray(predictions.targets, dtype=dtype),
            "image_ids": np.ascontiguousarray(predictions.image_ids, dtype=np.uint32),
        }
    )
    path = Path(path)
    atomic_write_bytes(path, blob)
    n_stages, n_images = predictions.predictions.shape
    return {
        "file": path.name,
        "sha256": hashlib.sha256(blob).hexdigest(),
        "n_stages": int(n_stages),
        "n_images": int(n_images),
        "dtype": dtype.name,
    }
