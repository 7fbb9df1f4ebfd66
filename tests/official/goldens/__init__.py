"""Golden outputs of the baselines' official code, for the suite's tests to compare against.

``python -m tests.official.goldens --official-root DIR`` imports the official modules from
local checkouts under DIR (each at the commit pinned in its module here), runs each component on
seeded inputs, with parameters copied from the suite's own module, and writes the official outputs
to ``tests/official/fixtures/<component>.safetensors`` (``golden.py`` says what a fixture holds).
The suite never contains the official code: it is read from DIR at generation time only. The tests
in ``tests/official`` feed the fixtures' inputs to the suite's components and compare. This package
runs from a source checkout: ``pyproject.toml`` leaves it out of the installed package, and no
installed module imports it (docs/baselines.md §16 says how to regenerate the fixtures).

One module of this package per official repository registers its components with
``@component(name, official)``; the package finds them all (``components()``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from benchmarks.core.registry import Registry
from tests.official.goldens.golden import Golden, Official


class Component(NamedTuple):
    """One component: the official repository it comes from and its generator."""

    official: Official
    make: Callable[[Path], Golden]


# The package's modules that register no component: the fixture format, the loops' records, and
# what one repository's components share (its cases, its official run).
SHARED_MODULES = frozenset(
    {"golden", "loop", "suite_loop", "clap4clip_cases", "clap4clip_official", "mindthegap_runner"}
)
#: every component by name; two generators are the same component when they are the same function
COMPONENTS: Registry[Component] = Registry(
    __name__, "component", SHARED_MODULES, defined_by=lambda component: component.make
)


def component(name: str, official: Official) -> Callable:
    """Register ``make(checkout) -> Golden`` as the generator of component ``name``."""

    def register(make: Callable[[Path], Golden]) -> Callable[[Path], Golden]:
        COMPONENTS.add(name, Component(official, make))
        return make

    return register


def components() -> dict[str, Component]:
    """Every registered component by name, after importing every source module of this package."""
    return dict(sorted(COMPONENTS.all().items()))
