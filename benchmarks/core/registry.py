"""Members found by name: classes registered by a decorator in the modules of one package, every
module imported on the first lookup, so a new member is one new file.

One rule says which modules hold no member (and are not imported for it): a name that starts with
``_``, or one the package lists as ``shared`` (the base its members build on). Strategies
(``strategies.registry``) and dataset units (``benchmarks.data.unit``) are two such registries.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Callable, Generic, TypeVar

Member = TypeVar("Member")


class Registry(Generic[Member]):
    """The members of ``package`` by name; ``kind`` names one in errors (``"strategy"``),
    ``importer`` imports a module by its full name (to word its failure)."""

    def __init__(
        self,
        package: str,
        kind: str,
        shared: frozenset[str] = frozenset(),
        importer: Callable[[str], object] = importlib.import_module,
    ):
        self.package = package
        self.kind = kind
        self.shared = shared
        self.importer = importer
        self.members: dict[str, Member] = {}
        self.discovered = False

    def holds_members(self, module: str) -> bool:
        """Whether the package's module ``module`` (its last name) is imported to find members."""
        return not module.startswith("_") and module not in self.shared

    def add(self, name: str, member: Member) -> None:
        """Register ``member`` (a class, or an instance of one) as ``name``; the same class again
        (a module imported twice) replaces it, another class under that name is an error."""
        if name in self.members and _class_of(self.members[name]) is not _class_of(member):
            raise ValueError(f"{self.kind} name {name!r} is registered twice")
        self.members[name] = member

    def all(self) -> dict[str, Member]:
        """Every member by name, the package's modules imported the first time."""
        if not self.discovered:
            package = importlib.import_module(self.package)
            for module in pkgutil.iter_modules(package.__path__):
                if self.holds_members(module.name):
                    self.importer(f"{self.package}.{module.name}")
            self.discovered = True
        return self.members


def _class_of(member: object) -> type:
    return member if isinstance(member, type) else type(member)
