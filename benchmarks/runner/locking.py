"""Run locks: at most one process computes a run, even when runners on several machines share a
results folder over a network file system.

A run's lock is a ``HeartbeatLock`` (``benchmarks.core.heartbeat_lock``: an exclusive file with its
holder inside and a heartbeat on its mtime, taken over when stale) at
``<results>/.locks/<dataset>/<label>/T<n>-seed<s>.lock``, recording this process's SLURM job id:
a SLURM job keeps its id when it is requeued, so a lock held under this process's own job id is a
previous life of this very job (killed before it could release the lock): it is taken over.

A run that fails releases its lock and leaves ``<results>/.locks/.../T<n>-seed<s>.error``: what
failed, where and when (``benchmarks.runner.status`` shows it; a later successful run removes it). A run
submitted to SLURM is marked ``.queued`` (its job id) until it finishes or its job fails.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from benchmarks.core.atomic_io import read_json_object
from benchmarks.core.heartbeat_lock import (
    HEARTBEAT_SECONDS,
    STALE_AFTER_SECONDS,
    HeartbeatLock,
    slurm_job_id,
)


class RunLock(HeartbeatLock):
    """The lock of one run, with the records beside it: why its last attempt failed (``.error``)
    and the SLURM job it was given (``.queued``)."""

    def __init__(
        self, path: Path, heartbeat: float = HEARTBEAT_SECONDS, stale_after: float = STALE_AFTER_SECONDS
    ):
        super().__init__(path, heartbeat, stale_after, job_id=slurm_job_id())

    @property
    def error_path(self) -> Path:
        return self.path.with_suffix(".error")

    @property
    def queued_path(self) -> Path:
        return self.path.with_suffix(".queued")

    def mark_queued(self, job: str) -> None:
        """Record that SLURM job ``job`` was given this run."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.queued_path.with_name(f".{self.queued_path.name}.{self.token}.tmp")
        tmp.write_text(json.dumps({"job_id": job, "submitted": time.time()}) + "\n")
        os.replace(tmp, self.queued_path)

    def read_queued(self) -> dict | None:
        """The queued record ({"job_id", "submitted"}), or None (none, or a damaged one)."""
        return read_json_object(self.queued_path, job_id=(str, int), submitted=(int, float))

    def mark_failed(self, error: str, job: str) -> None:
        """Record that SLURM job ``job`` failed this run without running it (a job that could never
        start, cancelled by the launcher): an error record naming the job, and no queued mark."""
        self._record_error(error, job)
        queued = self.read_queued()
        if queued is not None and queued.get("job_id") == job:
            self.queued_path.unlink(missing_ok=True)

    def _record_error(self, error: str, job: str | None) -> None:
        record = {
            "error": error,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "job_id": job,
            "when": time.time(),
        }
        tmp = self.error_path.with_name(f".{self.error_path.name}.{self.token}.tmp")
        tmp.write_text(json.dumps(record) + "\n")
        os.replace(tmp, self.error_path)

    def release(self, error: str | None = None, finished: bool = False) -> None:
        """Stop the heartbeat and remove the lock if it is still ours; record ``error`` (a run that
        failed), or clear an earlier one (``finished``: the run is done)."""
        self._stop_heartbeat()
        if error is not None:
            self._record_error(error, slurm_job_id())
        elif finished:
            self.error_path.unlink(missing_ok=True)
        queued = self.read_queued()
        if finished or (error is not None and queued is not None and queued.get("job_id") == slurm_job_id()):
            self.queued_path.unlink(missing_ok=True)  # an interrupted job keeps it: it is requeued
        super().release()
