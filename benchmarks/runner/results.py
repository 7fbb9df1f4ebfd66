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

The schema of a finished run is ``RunResult``, with ``StageResult`` and ``RunCost``
(``benchmarks.runner.result_record``, with the hash, the digest and the checks of what a result
is): each field is commented where it is defined, and ``docs/results-schema.md`` (tested against
these fields) explains it. ``benchmarks.runner.reading`` reads results back as these records.

A finished result is never replaced unsaid (``ResultStore.refusal``): not one of a newer schema,
not one of another label that shares the folder, not one of another config without ``--force``.
A file at a result's path that is no result, or whose digest disagrees with its stages and
summary, is named by every reader and left out (``unreadable_result``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from safetensors import SafetensorError

from benchmarks.core.atomic_io import atomic_write_bytes, read_json, read_tensors, write_json, write_tensors
from benchmarks.core.errors import UserError
from benchmarks.core.heartbeat_lock import is_side_file
from benchmarks.runner.result_record import (
    RunCost,
    RunResult,
    StageResult,
    changed_entries,
    result_digest,
    stored_key,
    unreadable_result,
    with_complete_summary,
)

# the key and file names live in run_key (no torch); imported from here too, as they always were
from benchmarks.runner.run_key import RESULT_NAME as RESULT_NAME
from benchmarks.runner.run_key import RUN_STEM as RUN_STEM
from benchmarks.runner.run_key import RunKey, safe_label
from benchmarks.runner.run_key import default_class_order as default_class_order

if TYPE_CHECKING:
    import torch

    from benchmarks.runner.locking import RunLock

PREDICTIONS_SUFFIX = ".predictions.safetensors"
CHECKPOINT_STATE = "state.json"  # the JSON half of a checkpoint, written after its tensors
PREDICTIONS_KEY = "runner/predictions"  # the predictions so far, among a checkpoint's tensors


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
        interrupted writes (``benchmarks.core.atomic_io``), locks (with a lock's private and set-aside
        files: ``HeartbeatLock``), and checkpoints."""
        return sorted(
            path
            for path in self.root.rglob("*")
            if path.is_file()
            and (
                path.name.endswith(".tmp")
                or path.suffix == ".lock"
                or is_side_file(path)
                or ".checkpoints" in path.parts
            )
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
        import torch  # here: reading results needs no torch

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


@dataclass
class RunProgress:
    """A run between tasks: what its checkpoint carries besides the strategy's own state."""

    stages: list[StageResult] = field(default_factory=list)
    cost: RunCost = field(default_factory=RunCost)
    predictions: list[np.ndarray] = field(default_factory=list)  # per stage: each test image's class

    @property
    def tasks_done(self) -> int:
        return len(self.stages)


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
