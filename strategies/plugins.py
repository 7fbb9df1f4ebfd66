"""Avalanche plugins a suite attaches to a run: ``plugins = { ReplayPlugin = { mem_size = 200 } }`` in
a strategy's or variant's table (or ``plugins = ["MyPlugin"]``).

A bare name is a plugin of ``avalanche.training.plugins``; ``module.path:ClassName`` is anyone's.
The table is part of the run's config (and of its hash), and a fresh plugin is built for every
run. Plugins attach to a strategy that runs Avalanche's loop (``avalanche_plugins`` in
``strategies.contract``): the suite's own and ``avalanche:`` strategies.

Each plugin's options are checked when the suite is read, against the plugin's signature, so that
a slip is one line naming the option and the suite table instead of a failure inside Avalanche
during task 1: an option it does not take, or lacks; a value of the wrong type where the plugin
annotates it (``mem_size: int``), or, unannotated, where its default is a plain number, string or
boolean; a negative number where that number's default is not negative, or it has none (a
memory size, a count, a weight).
"""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any

from avalanche.core import BasePlugin

from benchmarks.core.errors import UserError

OPTION = "plugins"  # the suite key; the runner takes it out of the strategy's options


def plugin_table(value: Any, strategy: str, where: str = "") -> dict[str, dict[str, Any]]:
    """The suite's ``plugins`` value as {name: options}, checked: every class found and a plugin, and
    its options taken by it (module docstring); ``where``: the suite table that set it, for the line."""
    if isinstance(value, list) and all(isinstance(name, str) for name in value):
        value = {name: {} for name in value}
    if not (isinstance(value, dict) and all(isinstance(v, dict) for v in value.values())):
        raise UserError(
            f"option plugins of {strategy} must be a list of plugin names or a table of them with their "
            "options, e.g. plugins = { ReplayPlugin = { mem_size = 200 } }"
        )
    for name, options in value.items():
        check_options(plugin_class(name), name, options, where or f"the options of {strategy}")
    return {name: dict(options) for name, options in value.items()}


def plugin_class(name: str) -> type:
    from strategies.registry import import_class

    cls = import_class(name if ":" in name else f"avalanche.training.plugins:{name}", what="plugin")
    if not (isinstance(cls, type) and issubclass(cls, BasePlugin)):
        raise UserError(
            f"plugin {name!r} is not an Avalanche plugin (a subclass of avalanche.core.BasePlugin)"
        )
    return cls


def build_plugins(table: dict[str, dict[str, Any]]) -> list:
    """Fresh plugins from a checked ``plugin_table``; a wrong option is one line."""
    plugins = []
    for name, options in table.items():
        try:
            plugins.append(plugin_class(name)(**options))
        except TypeError as err:
            raise UserError(f"plugin {name} does not take these options {sorted(options)}: {err}") from None
    return plugins


_SIMPLE = (bool, int, float, str)
_NAMES = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}


def check_options(cls: type[Any], name: str, options: dict[str, Any], where: str) -> None:
    """Refuse, in one line naming the option and ``where``, options ``cls`` cannot take (above)."""
    try:
        signature = inspect.signature(cls)
        signature.bind(**options)
    except TypeError as err:
        raise UserError(
            f"plugin {name} does not take these options {sorted(options)} (set in {where}): {err}"
        ) from None
    except ValueError:  # no signature to read (a C class): its constructor checks
        return
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # an annotation that cannot be resolved: fall back to the defaults
        hints = {}
    for key, value in options.items():
        parameter = signature.parameters.get(key)
        if parameter is None or parameter.kind is parameter.VAR_KEYWORD:
            continue
        kinds = _kinds(hints.get(key), parameter.default)
        if kinds is None:
            continue
        if not any(_fits(value, kind) for kind in kinds):
            wanted = " or ".join(dict.fromkeys(_NAMES[kind] for kind in kinds))
            raise UserError(f"plugin {name} in {where}: option {key} must be {wanted}, not {value!r}")
        default = parameter.default
        negative_default = isinstance(default, (int, float)) and not isinstance(default, bool) and default < 0
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if number and value < 0 and not negative_default:
            raise UserError(f"plugin {name} in {where}: option {key} must not be negative, not {value!r}")


def _kinds(hint: Any, default: Any) -> tuple[type, ...] | None:
    """The plain types an option may take, from its annotation or else its default; None: unknown
    (a sequence, a class, a Literal, no annotation and no plain default)."""
    if hint is not None:
        members = (
            typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        )
        members = tuple(m for m in members if m is not type(None))
        return members if members and all(m in _SIMPLE for m in members) else None
    if type(default) in _SIMPLE:
        return (int, float) if type(default) in (int, float) else (type(default),)
    return None


def _fits(value: Any, kind: type) -> bool:
    if kind is bool or isinstance(value, bool):
        return kind is bool and isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float))  # TOML writes 2 for 2.0
    return isinstance(value, kind)
