"""SIGTERM as the runner hears it (``timeout``, a CI cancel, ``kill``, a local launcher ending its
workers): ``Terminated`` raised in the main thread, so a run releases its lock and keeps its finished
tasks. Python ignores an exception raised inside a finaliser, and a library's bare ``except:`` may
swallow one raised during its import; so the runner asks ``stop_if_terminated`` at its safe points
(before each run, before each task), where a SIGTERM whose ``Terminated`` was lost is raised again.
"""

from __future__ import annotations

import os
import signal
import threading
import time


class Terminated(KeyboardInterrupt):
    """SIGTERM (``timeout``, a CI cancel, ``kill``, a local launcher ending its workers), raised in
    the main thread: the command stops as on Ctrl-C, so a run releases its lock and keeps its
    finished tasks, and a local launcher ends its workers first."""


#: SIGTERMs this soon after the first are its echoes (a worker whose launcher died hears it from
#: Linux and from the pipe at once), not a second request: the clean-up goes on
ECHO_SECONDS = 5.0
_first_sigterm: list[float] = []


def _raise_terminated(signum, frame) -> None:
    if not _first_sigterm:
        _first_sigterm.append(time.monotonic())
        raise Terminated()
    if time.monotonic() - _first_sigterm[0] > ECHO_SECONDS:  # asked again: end now, without a clean-up
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def stop_on_sigterm():
    """Make SIGTERM raise ``Terminated`` in this process (from its main thread only, as Python
    allows); without it, SIGTERM ends Python without a clean-up, leaving the lock to go stale.
    Returns the handler it replaced, for ``restore_sigterm`` (a command called in-process, by a test)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_terminated)


def restore_sigterm(previous) -> None:
    _first_sigterm.clear()
    if previous is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, previous)


def stop_if_terminated() -> None:
    """Raise ``Terminated`` where a SIGTERM came whose first ``Terminated`` was swallowed."""
    if _first_sigterm:
        raise Terminated()
