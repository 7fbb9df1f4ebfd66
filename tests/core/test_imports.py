"""``heavy_imports``: in a command's own process the block's imports run with no collection and what
they built is frozen; elsewhere (here: this test process has imported torch) nothing is paused or
frozen. That a real command exits without a word from Avalanche's compiled solvers is checked with
the command (tests/runner/test_command_start.py)."""

import gc
import subprocess
import sys
from pathlib import Path

from benchmarks.core.imports import heavy_imports

ROOT = Path(__file__).resolve().parents[2]

FRESH_PROCESS = """
import gc
from benchmarks.core.imports import heavy_imports

collections = []
gc.callbacks.append(lambda phase, info: phase == "start" and collections.append(info["generation"]))
with heavy_imports():
    during = gc.isenabled()
    made = [[index] for index in range(100_000)]  # 100,000 tracked lists: many collections unpaused
    import {module}
print(during, len(collections), gc.get_freeze_count() >= 100_000, gc.isenabled())
"""


def _fresh(module: str) -> subprocess.CompletedProcess:
    code = FRESH_PROCESS.format(module=module)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_in_a_fresh_process_the_block_collects_nothing_and_what_it_built_is_frozen():
    done = _fresh("json")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.split() == ["False", "0", "True", "True"]


def test_where_torch_is_imported_already_nothing_is_paused_or_frozen():
    frozen = gc.get_freeze_count()
    with heavy_imports():
        assert gc.isenabled()
        import decimal  # noqa: F401  (any import)
    assert gc.get_freeze_count() == frozen and gc.isenabled()
