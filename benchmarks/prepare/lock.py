"""One ``prepare`` per target and data root at a time.

The lock the runner's run lock is too (``benchmarks.core.heartbeat_lock``): a file created
exclusively, with its holder (host, pid) inside and a heartbeat on its mtime; a lock whose process
died on this host, or whose heartbeat stopped for five minutes, is taken over. It records no SLURM
job id: the runner takes over a lock held under its own job id (a requeued run's earlier life), but
two ``prepare`` commands may well share a job (``srun -n 2``).

The lock lives beside the target, ``DATA_ROOT/.prepare-TARGET.lock`` (the weights': in their cache
folder), and is removed when the command ends. A second command on the same target waits for the
first and says for whom, then finds the target prepared; ``--no-wait`` makes it stop in one line.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.core.errors import UserError
from benchmarks.core.heartbeat_lock import HeartbeatLock, Holder

POLL_SECONDS = 2.0


class TargetBusyError(UserError):
    """Another command holds the target's lock, and this one was told not to wait."""


def lock_path(folder: Path, target: str) -> Path:
    return folder / f".prepare-{target.replace(':', '-').replace('/', '-')}.lock"  # weights:MODEL/TAG


def target_lock_file(folder: Path, target: str) -> HeartbeatLock:
    """``target``'s lock, naming no SLURM job (two srun steps of one job must not take each other's
    lock), so only a dead process or a stopped heartbeat frees it."""
    return HeartbeatLock(lock_path(folder, target), job_id=None)


def describe(holder: Holder | None) -> str:
    if holder is None:
        return "another command (it just finished)"
    if holder.damaged:  # no holder to name: the runner's words for it, with its age
        return holder.describe()
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.since))
    return f"pid {holder.pid} on {holder.host}, since {since}"


@contextmanager
def target_lock(folder: Path, target: str, wait: bool = True) -> Iterator[None]:
    """Hold ``target``'s lock in ``folder`` for the block; wait for another holder (saying who, once)
    or, without ``wait``, raise ``TargetBusyError``."""
    lock = target_lock_file(folder, target)
    said: list[bool] = []

    def waiting(holder: Holder | None) -> None:
        if not wait:
            raise TargetBusyError(
                f"{target} is being prepared by {describe(holder)} (lock {lock.path}); rerun when it "
                "is done, or without --no-wait to wait for it"
            )
        if not said:
            print(f"{target}: waiting for {describe(holder)}, which is preparing it", file=sys.stderr)
            said.append(True)

    with lock.held(POLL_SECONDS, waiting):
        yield
