"""Members found by name: members registered by a decorator in the modules of one package, every
module imported on the first lookup, so a new member is one new file.

One rule says which modules hold no member (and are not imported for it): a name that starts with
``_``, or one the package lists as ``shared`` (the base its members build on). Strategies
(``strategies.registry``), dataset units (``benchmarks.data.unit``) and the official goldens'
components (``tests.official.goldens``, beside the tests) are such registries.
"""

from __future__ import annotations

import importlib
import pkgutil
import types
from typing import Callable, Generic, TypeVar

Member = TypeVar("Member")


def defining_object(member: object) -> type | types.FunctionType:
    """What defines ``member``: a class or a function itself, an instance its class."""
    return member if isinstance(member, (type, types.FunctionType)) else type(member)


class Registry(Generic[Member]):
    """The members of ``package`` by name; ``kind`` names one in errors (``"strategy"``),
    ``importer`` imports a module by its full name (to word its failure), ``defined_by`` gives the
    class or function that defines a member (the duplicate rule compares it)."""

    def __init__(
        self,
        package: str,
        kind: str,
        shared: frozenset[str] = frozenset(),
        importer: Callable[[str], object] = importlib.import_module,
        defined_by: Callable[[Member], type | types.FunctionType] = defining_object,
    ):
        self.package = package
        self.kind = kind
        self.shared = shared
        self.importer = importer
        self.defined_by = defined_by
        self.members: dict[str, Member] = {}
        self.discovered = False

    def holds_members(self, module: str) -> bool:
        """Whether the package's module ``module`` (its last name) is imported to find members."""
        return not module.startswith("_") and module not in self.shared

    def add(self, name: str, member: Member) -> None:
        """Register ``member`` as ``name``. A member defined by the same qualified name again (a
        module imported twice) replaces it; one defined elsewhere under that name is an error."""
        if name in self.members and self._origin(self.members[name]) != self._origin(member):
            raise ValueError(f"{self.kind} name {name!r} is registered twice")
        self.members[name] = member

    def module_names(self) -> list[str]:
        """The package's modules that hold members (their last names), found without importing them."""
        package = importlib.import_module(self.package)
        return [m.name for m in pkgutil.iter_modules(package.__path__) if self.holds_members(m.name)]

    def all(self) -> dict[str, Member]:
        """Every member by name, the package's modules imported the first time."""
        if not self.discovered:
            for name in self.module_names():
                self.importer(f"{self.package}.{name}")
            self.discovered = True
        return self.members

    def _origin(self, member: Member) -> str:
        # by name, not identity: a module imported twice defines new objects under the same names
        defining = self.defined_by(member)
        return f"{defining.__module__}.{defining.__qualname__}"
