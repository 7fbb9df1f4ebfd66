"""The results store: one versioned JSON file per run, written atomically.

Layout under a results directory::

    <dataset>/<label>/T<n_tasks>-seed<seed>.json     finished runs (schema below)
    .checkpoints/<dataset>/<label>/T<n_tasks>-seed<seed>/   state of an unfinished run

A run is identified by its *label* (the strategy name, or a variant name from the suite), dataset,
number of tasks and seed. Its resolved config is hashed; a finished file whose hash matches is
never recomputed unless the user asks (``--force``).

Schema (``schema_version`` 1)::

    schema_version  int     bumped on any incompatible change
    strategy        str     registry name of the strategy
    label           str     row name in tables (strategy or suite variant)
    dataset         str
    n_tasks         int
    seed            int
    config          dict    fully resolved: backbone, dataset options, strategy hyper-parameters,
                            class-order name, device, precision (fp32 | fp16 | bf16),
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
    diagnostics     dict    strategy-specific run-level diagnostics
    env             dict    python, packages, device, git_commit, git_dirty, hostname, started_at
    cost            dict    train_seconds, eval_seconds, trainable_params,
                            peak_memory_bytes: the largest over the run, across resumes;
                            peak_memory_kind: "cuda_allocated" (the CUDA allocator's peak) or
                              "cpu_max_rss" (a process peak: the process's max resident set,
                              which also covers whatever ran before in the same process),
                            amp_skipped_steps: fp16 steps the loss scaler skipped (0 otherwise)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from benchmarks.errors import UserError

SCHEMA_VERSION = 1
REQUIRED_KEYS = ("schema_version", "strategy", "label", "dataset", "n_tasks", "seed", "config",
                 "class_order", "tasks", "stages", "summary", "env", "cost")


def config_hash(config: dict) -> str:
    """A stable hash of a resolved config (key order does not matter)."""
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, data: Any) -> None:
    atomic_write_text(Path(path), json.dumps(data, indent=1, allow_nan=False) + "\n")


def read_json(path: Path) -> Any:
    """Read a JSON file; a corrupt one is a user error that names the file and the fix."""
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise UserError(f"corrupt result file {path} ({err.msg} at line {err.lineno}); "
                        "delete it and rerun, or rerun with --force") from None


@dataclass(frozen=True)
class RunKey:
    label: str
    dataset: str
    n_tasks: int
    seed: int

    @property
    def relpath(self) -> Path:
        return Path(self.dataset) / self.label / f"T{self.n_tasks}-seed{self.seed}"

    def __str__(self) -> str:
        return f"{self.label} / {self.dataset} / {self.n_tasks} tasks / seed {self.seed}"


class ResultStore:
    """Finished results and in-progress checkpoints under one directory."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def result_path(self, key: RunKey) -> Path:
        return self.root / key.relpath.with_suffix(".json")

    def checkpoint_dir(self, key: RunKey) -> Path:
        return self.root / ".checkpoints" / key.relpath

    def finished(self, key: RunKey, cfg_hash: str) -> dict | None:
        """The stored result of ``key`` if it exists and was made with the same config."""
        path = self.result_path(key)
        if not path.exists():
            return None
        result = read_json(path)
        if result.get("schema_version") != SCHEMA_VERSION or result.get("config_hash") != cfg_hash:
            return None
        return result

    def clear_checkpoint(self, key: RunKey) -> None:
        """Remove a run's checkpoint and the folders it leaves empty."""
        directory = self.checkpoint_dir(key)
        shutil.rmtree(directory, ignore_errors=True)
        for parent in directory.parents:
            if parent == self.root or not parent.is_dir() or any(parent.iterdir()):
                break
            parent.rmdir()

    def save(self, key: RunKey, result: dict) -> Path:
        missing = [k for k in REQUIRED_KEYS if k not in result]
        if missing:
            raise ValueError(f"result is missing keys {missing}")
        path = self.result_path(key)
        write_json(path, result)
        return path


def iter_results(root: str | Path) -> Iterator[tuple[Path, dict]]:
    """Every finished result JSON under ``root`` (checkpoints and other JSON files are skipped)."""
    root = Path(root)
    for path in sorted(root.rglob("*.json")):
        if ".checkpoints" in path.parts:
            continue
        data = read_json(path)
        if isinstance(data, dict) and "schema_version" in data and "stages" in data:
            yield path, data
