"""Golden outputs of the baselines' official code, for the suite's tests to compare against.

``python -m benchmarks.tools.official_goldens --official-root DIR`` imports the official modules from
local checkouts under DIR (each at the commit pinned in its module here), runs each component on
seeded inputs, with parameters copied from the suite's own module, and writes the official outputs
to ``tests/official/fixtures/<component>.safetensors`` (``golden.py`` says what a fixture holds).
The suite never contains the official code: it is read from DIR at generation time only. The tests
in ``tests/official`` feed the fixtures' inputs to the suite's components and compare.

One module of this package per official repository registers its components with
``@component(name, official)``; the package finds them all (``components()``).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path

from benchmarks.tools.official_goldens.golden import Golden, Official

_REGISTRY: dict[str, tuple[Official, Callable[[Path], Golden]]] = {}
_NOT_SOURCES = {"golden", "__main__"}


def component(name: str, official: Official) -> Callable:
    """Register ``make(checkout) -> Golden`` as the generator of component ``name``."""

    def register(make: Callable[[Path], Golden]) -> Callable[[Path], Golden]:
        if name in _REGISTRY:
            raise ValueError(f"component {name!r} registered twice")
        _REGISTRY[name] = (official, make)
        return make

    return register


def components() -> dict[str, tuple[Official, Callable[[Path], Golden]]]:
    """Every registered component, after importing every source module of this package."""
    for info in pkgutil.iter_modules(__path__):
        if info.name not in _NOT_SOURCES:
            importlib.import_module(f"{__name__}.{info.name}")
    return dict(sorted(_REGISTRY.items()))
