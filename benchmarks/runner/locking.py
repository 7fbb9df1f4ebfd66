"""Run locks: at most one process computes a run, even when runners on several machines share a
results folder over a network file system.

A lock is a file created exclusively (``O_CREAT | O_EXCL``, atomic on local disks and on NFS v3+)
at ``<results>/.locks/<dataset>/<label>/T<n>-seed<s>.lock``. It holds who took it (host, pid,
SLURM job id where there is one, since when) and its mtime is a heartbeat, refreshed by a daemon
thread. A lock whose heartbeat is older than ``stale_after`` seconds, or whose process is gone
from this host, is stale: a runner takes it over by renaming it away (only one rename of the
same file succeeds) and creating its own.

A run that fails releases its lock and leaves ``<results>/.locks/.../T<n>-seed<s>.error``: what
failed, where and when (``benchmarks.runner.status`` shows it; a later successful run removes it). A run
submitted to SLURM is marked ``.queued`` (its job id) until it finishes or its job fails.

A SLURM job keeps its id when it is requeued, so a lock held under this process's own job id is
a previous life of this very job (killed before it could release the lock): it is taken over.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

HEARTBEAT_SECONDS = 30.0
STALE_AFTER_SECONDS = 300.0  # ten missed heartbeats


def job_id() -> str | None:
    """The SLURM job (``<array job>_<task>`` for an array task) this process runs in, if any."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID")


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, as read from its file."""

    host: str
    pid: int
    job_id: str | None
    since: float
    heartbeat: float  # the file's mtime

    def describe(self) -> str:
        who = f"job {self.job_id}" if self.job_id else f"pid {self.pid}"
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"{self.host}, {who}, since {since}"


def read_holder(path: Path) -> Holder | None:
    """The holder of the lock at ``path``, or None if there is no lock (or it is being replaced)."""
    try:
        heartbeat = path.stat().st_mtime
        data = json.loads(path.read_text() or "{}")
    except (FileNotFoundError, ValueError):
        return None
    return Holder(
        str(data.get("host", "?")),
        int(data.get("pid", 0)),
        data.get("job_id"),
        float(data.get("since", heartbeat)),
        heartbeat,
    )


def _process_gone(holder: Holder) -> bool:
    if holder.host != socket.gethostname() or holder.pid <= 0:
        return False  # another machine's process: only its heartbeat can tell
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def is_stale(holder: Holder, stale_after: float = STALE_AFTER_SECONDS, now: float | None = None) -> bool:
    """A lock nobody keeps alive: no heartbeat for ``stale_after`` seconds, or its process died here."""
    return (now or time.time()) - holder.heartbeat > stale_after or _process_gone(holder)


class RunLock:
    """The lock of one run. ``acquire()`` returns False if another live process holds it."""

    def __init__(
        self, path: Path, heartbeat: float = HEARTBEAT_SECONDS, stale_after: float = STALE_AFTER_SECONDS
    ):
        self.path = Path(path)
        self.heartbeat_seconds = heartbeat
        self.stale_after = stale_after
        self.token = uuid.uuid4().hex  # tells our lock file from a successor's
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.took_over: Holder | None = None  # the stale holder replaced, if any

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
        """The queued record ({"job_id", "submitted"}), or None."""
        try:
            return json.loads(self.queued_path.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def mark_failed(self, error: str, job: str) -> None:
        """Record that SLURM job ``job`` failed this run without running it (a job that could never
        start, cancelled by the launcher): an error record naming the job, and no queued mark."""
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
        queued = self.read_queued()
        if queued is not None and queued.get("job_id") == job:
            self.queued_path.unlink(missing_ok=True)

    def acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):  # a takeover race lost to another runner ends in "held"
            if self._create():
                self._start_heartbeat()
                return True
            holder = read_holder(self.path)
            if holder is None:
                continue  # released or replaced meanwhile: try again
            ours = holder.job_id is not None and holder.job_id == job_id()  # this job before a requeue
            if not ours and not is_stale(holder, self.stale_after):
                return False
            aside = self.path.with_name(f"{self.path.name}.stale-{self.token}")
            try:
                os.rename(self.path, aside)  # only one runner's rename of this file succeeds
            except FileNotFoundError:
                continue
            aside.unlink(missing_ok=True)
            self.took_over = holder
        return False

    def holder_job_id(self) -> str | None:
        """The SLURM job recorded as the holder: a later life of the same job may take the lock over."""
        return job_id()

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as handle:
            json.dump(
                {
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                    "job_id": self.holder_job_id(),
                    "since": time.time(),
                    "token": self.token,
                },
                handle,
            )
            handle.flush()
            os.fsync(handle.fileno())
        return True

    def _start_heartbeat(self) -> None:
        def beat():
            while not self._stop.wait(self.heartbeat_seconds):
                try:
                    os.utime(self.path)
                except FileNotFoundError:
                    return

        self._stop.clear()
        self._thread = threading.Thread(target=beat, name=f"heartbeat {self.path.name}", daemon=True)
        self._thread.start()

    def _ours(self) -> bool:
        try:
            return json.loads(self.path.read_text()).get("token") == self.token
        except (FileNotFoundError, ValueError):
            return False

    def release(self, error: str | None = None, finished: bool = False) -> None:
        """Stop the heartbeat and remove the lock if it is still ours; record ``error`` (a run that
        failed), or clear an earlier one (``finished``: the run is done)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if error is not None:
            record = {
                "error": error,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "job_id": job_id(),
                "when": time.time(),
            }
            tmp = self.error_path.with_name(f".{self.error_path.name}.{self.token}.tmp")
            tmp.write_text(json.dumps(record) + "\n")
            os.replace(tmp, self.error_path)
        elif finished:
            self.error_path.unlink(missing_ok=True)
        queued = self.read_queued()
        if finished or (error is not None and queued is not None and queued.get("job_id") == job_id()):
            self.queued_path.unlink(missing_ok=True)  # an interrupted job keeps it: it is requeued
        if self._ours():
            self.path.unlink(missing_ok=True)
