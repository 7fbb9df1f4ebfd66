"""The results store: one versioned JSON file per run, written atomically.

Layout under a results directory::

    <dataset>/<label>/T<n_tasks>-seed<seed>.json     finished runs (schema below)
    <dataset>/<label>/T<n_tasks>-seed<seed>.predictions.safetensors   their per-image predictions
    .checkpoints/<dataset>/<label>/T<n_tasks>-seed<seed>/   state of an unfinished run
    .locks/<dataset>/<label>/T<n_tasks>-seed<seed>.lock     held while a process computes the run
    .locks/<dataset>/<label>/T<n_tasks>-seed<seed>.error    why its last attempt failed

A run is identified by its *label* (the strategy name, or a variant name from the suite), dataset,
number of tasks and seed. Its folder is ``safe_label(label)``: a ``module:Class`` strategy's folder
has ``_`` for the colon; the JSON keeps the label itself. Its resolved config is hashed; a finished
file whose hash matches is never recomputed unless the user asks (``--force``).

Schema (``schema_version`` 2; version 1 lacks ``predictions`` and still loads everywhere)::

    schema_version  int     bumped on any change of the layout
    strategy        str     registry name of the strategy
    label           str     row name in tables (strategy or suite variant)
    dataset         str
    n_tasks         int
    seed            int
    config          dict    fully resolved: backbone, dataset options, strategy hyper-parameters,
                            class-order name, device, precision (fp32 | fp16 | bf16; "auto"
                            resolved with the strategy's ``amp``),
                            deterministic (bool); ``config_hash`` is its SHA-256 prefix
    config_hash     str
    class_order     [int]   the class permutation of the stream
    class_names     [str]   names indexed by class id
    tasks           [[int]] class ids per task
    stages          [stage] one per task, in order:
        task             int      1-based
        acc              float    % top-1 over test samples of all seen classes
        acc_per_task     [float]  % on each learned task's test images
        n_test_per_task  [int]
        routing_acc      float    % of samples whose predicted class lies in their true task
        auroc, fpr95     float|null  % seen-vs-future detection by max softmax; null at stage T
        diagnostics      dict     strategy-specific, documented by the strategy
    summary         dict    avg_acc, last_acc, avg_auroc, last_auroc
    predictions     dict    the sidecar beside the JSON (version 2): file (its name), sha256 (of
                            its bytes), n_stages, n_images, dtype. The safetensors file holds
                              predictions  [n_stages, n_images]  the predicted class id of every
                                           test image (seen and future classes) after each task;
                              targets      [n_images]  the true class ids;
                              image_ids    [n_images]  each image's index in the test split;
                            uint16 where class ids fit (uint32 otherwise), uint32 image ids.
    diagnostics     dict    strategy-specific run-level diagnostics
    env             dict    python, packages, device, git_commit, git_dirty, hostname, started_at
    cost            dict    train_seconds, eval_seconds, trainable_params,
                            peak_memory_bytes: the largest over the run, across resumes;
                            peak_memory_kind: "cuda_allocated" (the CUDA allocator's peak),
                              "cpu_run_peak_rss" (the run's own resident-set peak: Linux's VmHWM,
                              reset when the run starts) or "cpu_process_peak_rss" (where no reset
                              is possible: the process's max resident set, which also covers
                              whatever ran before in the same process; "cpu_max_rss" in version 1),
                            amp_skipped_steps: fp16 steps the loss scaler skipped (0 otherwise)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import numpy as np

from benchmarks.core.atomic_io import atomic_write_bytes, read_json, write_json
from benchmarks.core.errors import UserError

if TYPE_CHECKING:
    from benchmarks.runner.locking import RunLock

SCHEMA_VERSION = 2
READABLE_SCHEMA_VERSIONS = (1, 2)  # version 1: no predictions sidecar
PREDICTIONS_SUFFIX = ".predictions.safetensors"
CHECKPOINT_STATE = "state.json"  # the JSON half of a checkpoint, written after its tensors
REQUIRED_KEYS = (
    "schema_version",
    "strategy",
    "label",
    "dataset",
    "n_tasks",
    "seed",
    "config",
    "class_order",
    "tasks",
    "stages",
    "summary",
    "env",
    "cost",
)


#: config entries that record, not determine: left out of the hash
UNHASHED_CONFIG_KEYS = ("option_sources",)


def config_hash(config: dict) -> str:
    """A stable hash of a resolved config (key order does not matter; ``UNHASHED_CONFIG_KEYS`` left out)."""
    blob = json.dumps(
        {k: v for k, v in config.items() if k not in UNHASHED_CONFIG_KEYS},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def safe_label(label: str) -> str:
    """A run label as a file or folder name, the one form every path of a run uses (results,
    checkpoints, locks, logs, the comparison's files): each character other than a letter, digit,
    ``.``, ``_`` or ``-`` becomes ``_`` (``my_strategy.strategy:MyStrategy`` ->
    ``my_strategy.strategy_MyStrategy``), as does a leading ``.`` (a hidden folder is never read).
    Registered names and variant labels stay as they are."""
    return re.sub(r"[^A-Za-z0-9._-]|^\.", "_", label) or "_"


@dataclass(frozen=True)
class RunKey:
    label: str
    dataset: str
    n_tasks: int
    seed: int

    @property
    def relpath(self) -> Path:
        return Path(self.dataset) / safe_label(self.label) / f"T{self.n_tasks}-seed{self.seed}"

    def __str__(self) -> str:
        return f"{self.label} / {self.dataset} / {self.n_tasks} tasks / seed {self.seed}"


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

    def finished(self, key: RunKey, cfg_hash: str | None) -> dict | None:
        """The stored result of ``key`` if it exists and was made with the same config (with
        ``cfg_hash`` None: with any config)."""
        path = self.result_path(key)
        if not path.exists():
            return None
        result = read_json(path)
        if result.get("schema_version") not in READABLE_SCHEMA_VERSIONS or cfg_hash not in (
            None,
            result.get("config_hash"),
        ):
            return None
        return result

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

    def save(self, key: RunKey, result: dict, predictions: "Predictions | None" = None) -> Path:
        """Store a finished run: its predictions sidecar first, then the JSON that names it and
        its digest, so that a JSON on disk always finds the sidecar it was written with."""
        missing = [k for k in REQUIRED_KEYS if k not in result]
        if missing:
            raise ValueError(f"result is missing keys {missing}")
        path = self.result_path(key)
        if predictions is not None:
            result = {**result, "predictions": save_predictions(predictions_path(path), predictions)}
        write_json(path, result)
        return path


def not_a_measurement(result: dict) -> str | None:
    """Why a result checks the code path rather than measuring anything: a ``--fast-dev-run``, or
    fake data (``benchmarks.tools.fake_data``); None for a real result. Tables, the report and the
    comparison say so wherever they show one."""
    config = result.get("config", {})
    reasons = [
        why
        for why, flag in (("a fast dev run", "fast_dev_run"), ("fake data", "fake_data"))
        if config.get(flag)
    ]
    return " on ".join(reasons) or None


def iter_results(root: str | Path, skipped: list[str] | None = None) -> Iterator[tuple[Path, dict]]:
    """Every finished result JSON under ``root`` (checkpoints and other JSON files are skipped).

    A result of another ``schema_version`` is skipped too, with a line naming the file: appended to
    ``skipped`` where given, else a warning.
    """
    root = Path(root)
    paths = []
    for folder, subfolders, files in os.walk(root):  # unreadable or vanishing folders are skipped
        subfolders[:] = [d for d in subfolders if not d.startswith(".")]  # .checkpoints, .locks, .logs
        paths += [Path(folder) / name for name in files if name.endswith(".json")]
    for path in sorted(paths):
        try:
            data = read_json(path)
        except FileNotFoundError:  # removed by another runner meanwhile
            continue
        if not (isinstance(data, dict) and "schema_version" in data and "stages" in data):
            continue
        if data["schema_version"] not in READABLE_SCHEMA_VERSIONS:
            line = (
                f"skipped {path}: schema_version {data['schema_version']!r}, this suite reads versions "
                f"{', '.join(map(str, READABLE_SCHEMA_VERSIONS))}; rerun that run or convert the file"
            )
            skipped.append(line) if skipped is not None else warnings.warn(line, stacklevel=2)
            continue
        yield path, data


@dataclass(frozen=True)
class Predictions:
    """Every test image's predicted class after each task, with the true classes (the sidecar)."""

    predictions: np.ndarray  # [n_stages, n_images] class ids
    targets: np.ndarray  # [n_images]
    image_ids: np.ndarray  # [n_images] index in the test split

    def correct(self) -> np.ndarray:
        """``[n_stages, n_images]`` booleans: predicted class == true class."""
        return self.predictions == self.targets[None, :]


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


def load_predictions(
    result_path: Path, result: dict, problems: list[str] | None = None
) -> Predictions | None:
    """The sidecar of a stored result, checked against the digest its JSON holds; or None.

    None without a word for a version-1 result (it has none). For a missing or damaged sidecar, a
    one-line reason goes to ``problems`` where given, else a warning: the result's means stay
    usable, only the per-image analyses lose that run.
    """
    from safetensors.numpy import load

    entry = result.get("predictions")
    if not entry:
        return None
    path = Path(result_path).parent / entry["file"]

    def problem(why: str) -> None:
        line = (
            f"{path}: {why}; the run's means are used, its per-image analyses are not (rerun it with --force)"
        )
        problems.append(line) if problems is not None else warnings.warn(line, stacklevel=3)

    try:
        blob = path.read_bytes()
    except OSError:
        return problem("predictions sidecar missing")
    if hashlib.sha256(blob).hexdigest() != entry["sha256"]:
        return problem("predictions sidecar damaged (its SHA-256 differs from the one in the result)")
    try:
        tensors = load(blob)
        found = Predictions(
            tensors["predictions"].astype(np.int64),
            tensors["targets"].astype(np.int64),
            tensors["image_ids"].astype(np.int64),
        )
    except Exception as err:  # safetensors raises its own error types  # noqa: BLE001
        return problem(f"predictions sidecar unreadable ({type(err).__name__})")
    expected = (len(result["stages"]), entry["n_images"])
    if found.predictions.shape != expected or found.targets.shape != expected[1:]:
        return problem(f"predictions sidecar has shape {found.predictions.shape}, expected {expected}")
    return found
