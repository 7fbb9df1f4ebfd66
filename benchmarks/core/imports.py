"""A command's first heavy imports with Python's cyclic garbage collector paused.

torch, Avalanche (with the scipy, torchmetrics, transformers, JAX and wandb it pulls in), open_clip
and peft build about a million Python objects as they are imported, and the collector scans all of
those already built at each full collection on the way: a third of the import's CPU time
(docs/testing.md, "The garbage collector during imports"). Paused, then frozen (``gc.freeze``),
they are never scanned again, and a forked loader worker does not copy their pages by scanning them
(Python's ``gc.freeze`` documentation). At exit they are unfrozen, so that they are collected as
before: compiled solvers that Avalanche imports (qpsolvers' nanobind ones) report leaks otherwise.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def heavy_imports() -> Iterator[None]:
    """The block's imports with the collector paused, and what is alive after them frozen. Only in
    a process that has not imported torch yet (a command's own process): in one that has (a
    notebook, the tests, a second call), what is alive may include garbage that freezing would keep
    for the process's life, so the block runs as it is."""
    if "torch" in sys.modules or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        atexit.register(gc.unfreeze)
        gc.enable()
