"""A lock file that at most one live process holds, even across machines sharing a network file
system: the run lock (``benchmarks.runner.locking``) and ``prepare``'s lock are both this one.

A lock is a file created exclusively and whole (written under a private name, then hard-linked to
the lock's: atomic on local disks and on NFS; ``O_CREAT | O_EXCL`` where there are no hard links).
It holds who took it (host, pid, SLURM job id where the lock records one, since when, the command
it belongs to) and its mtime is a heartbeat, refreshed by a daemon thread. A lock whose heartbeat
is older than ``stale_after`` seconds, or whose process is gone from this host, is stale: another
process takes it over by renaming it away (only one rename of the same file succeeds) and creating
its own. A lock held under the taker's own job id is a previous life of that very job (a requeued
job keeps its id) and is taken over too; a lock made with ``job_id=None`` records none, so only a
dead process or a stopped heartbeat frees it.

A lock file that cannot be read as a holder (JSON cut off by a full disk or a network file system,
a pid that is not a number) is a damaged lock: judged by its age like an empty one (a lock being
written is empty for an instant, so a young one is left alone), and named as damaged wherever a
holder is shown.

A lock records the command it belongs to (``command_pid``, ``command_started``): a local launcher's
worker inherits its launcher's (``COMMAND_ENV``), so a rerun can name the command that holds a run.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

HEARTBEAT_SECONDS = 30.0
STALE_AFTER_SECONDS = 300.0  # ten missed heartbeats
#: ``link`` failing this way: a file system without hard links (FAT, some FUSE and object-store mounts)
NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP}
#: what a lock's side files add to its name: the private file ``_create`` links from, and the name a
#: stale lock is set aside under during a takeover (``is_side_file``)
PRIVATE_MARK, ASIDE_MARK = ".new-", ".stale-"
#: set by the local launcher for its workers: "<pid> <start time>" of the command they belong to
COMMAND_ENV = "CIL_BENCH_COMMAND"
_STARTED = time.time()  # this process's start, near enough: the runner imports this module early


def this_command() -> tuple[int, float]:
    """The pid and start time of the command this process belongs to: its launcher's, for a worker."""
    pid, _, started = os.environ.get(COMMAND_ENV, "").partition(" ")
    try:
        return int(pid), float(started)
    except ValueError:
        return os.getpid(), _STARTED


def slurm_job_id() -> str | None:
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
    damaged: str | None = None  # why the file names no holder (cut-off JSON, a pid not a number)
    path: Path | None = None
    command_pid: int | None = None  # the command the holder belongs to (``this_command``)
    command_started: float | None = None

    def describe(self) -> str:
        if self.damaged:
            written = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.heartbeat))
            stale = time.strftime("%H:%M:%S", time.localtime(self.heartbeat + STALE_AFTER_SECONDS))
            return (
                f"a damaged lock file {self.path} ({self.damaged}), last written {written}, "
                f"stale and taken over from {stale}"
            )
        who = f"job {self.job_id}" if self.job_id else f"pid {self.pid}"
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        command = ""
        if self.command_started is not None:
            started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.command_started))
            command = f", of the command (pid {self.command_pid}) started {started}"
        return f"{self.host}, {who}, since {since}{command}"


def read_holder(path: Path) -> Holder | None:
    """The holder of the lock at ``path``, or None if there is no lock (or it is being replaced).
    A file that names no holder is a damaged one (``Holder.damaged``), judged by its age alone."""
    try:
        heartbeat = path.stat().st_mtime
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text or "{}")
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        command_pid, command_started = data.get("command_pid"), data.get("command_started")
        return Holder(
            str(data.get("host", "?")),
            int(data.get("pid", 0)),
            data.get("job_id"),
            float(data.get("since", heartbeat)),
            heartbeat,
            path=path,
            command_pid=None if command_pid is None else int(command_pid),
            command_started=None if command_started is None else float(command_started),
        )
    except (ValueError, TypeError) as err:
        why = "cut-off or invalid JSON" if isinstance(err, json.JSONDecodeError) else f"unreadable: {err}"
        return Holder("?", 0, None, heartbeat, heartbeat, damaged=why, path=path)


def _process_gone(holder: Holder) -> bool:
    if holder.host != socket.gethostname() or holder.pid <= 0:
        return False  # another machine's process: only its heartbeat can tell
    try:
        os.kill(holder.pid, 0)
    except (ProcessLookupError, OverflowError):  # OverflowError: no process has such a pid
        return True
    except PermissionError:
        return False
    return False


def is_stale(holder: Holder, stale_after: float = STALE_AFTER_SECONDS, now: float | None = None) -> bool:
    """A lock nobody keeps alive: no heartbeat for ``stale_after`` seconds, or its process died here."""
    return (now or time.time()) - holder.heartbeat > stale_after or _process_gone(holder)


def is_side_file(path: Path, lock_suffix: str = ".lock") -> bool:
    """Whether ``path`` is a side file of a lock named ``*<lock_suffix>`` (a private or set-aside
    file that an interrupted acquisition or takeover can leave)."""
    return any(f"{lock_suffix}{mark}" in path.name for mark in (PRIVATE_MARK, ASIDE_MARK))


class HeartbeatLock:
    """One lock file. ``acquire()`` returns False if another live process holds it; ``job_id`` is
    the SLURM job recorded as the holder (a later life of that job takes the lock over), or None."""

    def __init__(
        self,
        path: Path,
        heartbeat: float = HEARTBEAT_SECONDS,
        stale_after: float = STALE_AFTER_SECONDS,
        job_id: str | None = None,
    ):
        self.path = Path(path)
        self.heartbeat_seconds = heartbeat
        self.stale_after = stale_after
        self.job_id = job_id
        self.token = uuid.uuid4().hex  # tells our lock file from a successor's
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.took_over: Holder | None = None  # the stale holder replaced, if any

    def acquire(self) -> bool:
        """Take the lock (True), or find it held by a live process (False). Interrupted part-way (a
        SIGTERM raises in this thread), it leaves no lock file of its own behind."""
        try:
            return self._acquire()
        except BaseException:
            self.release()
            raise

    def _acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):  # a takeover race lost to another process ends in "held"
            if self._create():
                self._start_heartbeat()
                return True
            holder = read_holder(self.path)
            if holder is None:
                continue  # released or replaced meanwhile: try again
            ours = holder.job_id is not None and holder.job_id == self.job_id  # this job before a requeue
            if not ours and not is_stale(holder, self.stale_after):
                return False
            aside = self.path.with_name(f"{self.path.name}{ASIDE_MARK}{self.token}")
            try:
                os.rename(self.path, aside)  # only one process's rename of this file succeeds
            except FileNotFoundError:
                continue
            aside.unlink(missing_ok=True)
            self.took_over = holder
        return False

    @contextlib.contextmanager
    def held(
        self, poll: float, while_held: Callable[[Holder | None], None] | None = None
    ) -> Iterator[HeartbeatLock]:
        """The lock, held for the block, taken as soon as it is free (tried every ``poll`` seconds);
        ``while_held`` hears its holder each time another has it, and may raise to stop waiting. The
        block may ``release`` it early; it is released at the end either way."""
        while not self.acquire():
            if while_held is not None:
                while_held(read_holder(self.path))
            time.sleep(poll)
        try:
            yield self
        finally:
            self.release()  # a no-op where released already, or where the file is another's

    def _create(self) -> bool:
        """Create the lock whole: the holder written to a private file, then linked to the lock's name
        (``link`` fails where the name exists: exclusive, as ``O_EXCL``, on local disks and NFS). A
        SIGTERM can raise in the main thread as any call returns; so the lock exists holding this
        process's token from its first instant, and ``release`` removes it (and the private file)
        however early the signal lands. Where the file system has no hard links, ``O_EXCL``."""
        private = self._private_path()
        try:
            with open(private, "x") as handle:
                self._write_holder(handle)
            os.link(private, self.path)
        except FileExistsError:
            return self._ours()  # NFS may answer a retried link "exists" when the first one made it
        except OSError as err:
            if err.errno not in NO_HARD_LINKS:
                raise
            return self._create_exclusively()
        finally:
            private.unlink(missing_ok=True)
        return True

    def _private_path(self) -> Path:
        return self.path.with_name(f"{self.path.name}{PRIVATE_MARK}{self.token}")

    def _write_holder(self, handle) -> None:
        """This process as the holder, written to ``handle`` and on disk before the lock counts."""
        command_pid, command_started = this_command()
        record = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "job_id": self.job_id,
            "since": time.time(),
            "token": self.token,
            "command_pid": command_pid,
            "command_started": command_started,
        }
        json.dump(record, handle)
        handle.flush()
        os.fsync(handle.fileno())

    def _create_exclusively(self) -> bool:
        """``_create`` on a file system without hard links: the file is empty for an instant, and a
        signal landing in it leaves an empty lock, judged by its age as a damaged one."""
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        try:
            with os.fdopen(fd, "w") as handle:
                self._write_holder(handle)
        except BaseException:  # this process created it a moment ago: a half-written lock is no lock
            self.path.unlink(missing_ok=True)
            raise
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

    def _stop_heartbeat(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _ours(self) -> bool:
        try:
            data = json.loads(self.path.read_text(errors="replace"))
        except (FileNotFoundError, ValueError):
            return False
        return isinstance(data, dict) and data.get("token") == self.token

    def release(self) -> None:
        """Stop the heartbeat and remove the lock if it is still ours (and a private file that an
        interrupted ``_create`` left)."""
        self._stop_heartbeat()
        if self._ours():
            self.path.unlink(missing_ok=True)
        self._private_path().unlink(missing_ok=True)
