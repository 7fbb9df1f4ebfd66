"""Strategies by name. Adding a strategy is one file in ``strategies/`` with ``@register("name")``.

Every module of the ``strategies`` package is imported on first lookup, so a new file needs no
edit elsewhere. A strategy outside the package can be named as ``module.path:ClassName``.
"""

from __future__ import annotations

import importlib
import pkgutil

from benchmarks.core.errors import UserError

_REGISTRY: dict[str, type] = {}
_DISCOVERED = False


def register(name: str):
    """Class decorator: make a ``CLIPStrategy`` subclass available under ``name``."""

    def wrap(cls):
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"strategy name {name!r} is registered twice")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return wrap


def _discover() -> None:
    global _DISCOVERED
    if _DISCOVERED:
        return
    import strategies

    for module in pkgutil.iter_modules(strategies.__path__):
        if module.name not in {"base", "registry"}:
            importlib.import_module(f"strategies.{module.name}")
    _DISCOVERED = True


def available() -> list[str]:
    _discover()
    return sorted(_REGISTRY)


def get_strategy(name: str) -> type:
    """The strategy class registered as ``name`` (or imported from ``module:Class``)."""
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            return getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as err:
            raise UserError(
                f"cannot import strategy {name!r} ({err}); "
                "give it as module.path:ClassName on the Python path"
            ) from None
    _discover()
    if name not in _REGISTRY:
        raise UserError(f"unknown strategy {name!r}; available: {', '.join(available())}")
    return _REGISTRY[name]
