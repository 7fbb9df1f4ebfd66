"""Avalanche plugins a suite attaches to a run: ``plugins = { ReplayPlugin = { mem_size = 200 } }`` in
a strategy's or variant's table (or ``plugins = ["MyPlugin"]``).

A bare name is a plugin of ``avalanche.training.plugins``; ``module.path:ClassName`` is anyone's.
The table is part of the run's config (and of its hash), and a fresh plugin is built for every
run. Plugins attach to a strategy that runs Avalanche's loop (``avalanche_plugins`` in
``strategies.contract``): the suite's own and ``avalanche:`` strategies.
"""

from __future__ import annotations

from typing import Any

from avalanche.core import BasePlugin

from benchmarks.core.errors import UserError

OPTION = "plugins"  # the suite key; the runner takes it out of the strategy's options


def plugin_table(value: Any, strategy: str) -> dict[str, dict[str, Any]]:
    """The suite's ``plugins`` value as {name: options}, checked: every class found and a plugin."""
    if isinstance(value, list) and all(isinstance(name, str) for name in value):
        value = {name: {} for name in value}
    if not (isinstance(value, dict) and all(isinstance(v, dict) for v in value.values())):
        raise UserError(
            f"option plugins of {strategy} must be a list of plugin names or a table of them with their "
            "options, e.g. plugins = { ReplayPlugin = { mem_size = 200 } }"
        )
    for name in value:
        plugin_class(name)
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
