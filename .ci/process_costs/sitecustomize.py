"""Log each Python process's CPU time, for `.ci/process_costs/summary.py`.

On the path (PYTHONPATH=.ci/process_costs) with CI_PROCESS_COSTS naming a file, every Python process
started below appends one JSON line to it when it exits normally: its command, wall and CPU seconds,
whether it imported Avalanche, and the test that started it (pytest's PYTEST_CURRENT_TEST as the
process found it at its start: a test's subprocesses inherit it, pytest's own processes start without
it). Processes that end with os._exit (forked loader workers) or a signal write nothing.
"""

import atexit
import json
import os
import resource
import sys
import time

_LOG = os.environ.get("CI_PROCESS_COSTS")
_STARTED = time.time()
_TEST = os.environ.get("PYTEST_CURRENT_TEST")


def _write() -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    line = {
        "argv": sys.argv[:4],
        "wall_s": round(time.time() - _STARTED, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "avalanche": "avalanche" in sys.modules,
        "test": _TEST.rsplit(" ", 1)[0] if _TEST else None,
    }
    try:
        with open(_LOG, "a") as log:  # one short write: lines from parallel processes stay whole
            log.write(json.dumps(line) + "\n")
    except OSError:  # a measurement aid: never a traceback in the output of the process it measures
        pass


if _LOG:
    atexit.register(_write)
