"""The search space of ``python -m benchmarks.tune``: a TOML file with one table per strategy label
and one entry per Config field, a range or a choice. Its tables are checked against the suite
without importing any strategy (so a slip in the file is one line before torch loads); its fields
against each strategy's Config.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

from benchmarks.core.errors import UserError


@dataclasses.dataclass(frozen=True)
class Dimension:
    """One Config field of the search space: a range (``low``, ``high``, ``log``) or ``choices``."""

    name: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    choices: tuple | None = None

    def suggest(self, trial) -> Any:
        if self.choices is not None:
            return trial.suggest_categorical(self.name, list(self.choices))
        if isinstance(self.low, int) and isinstance(self.high, int):
            return trial.suggest_int(self.name, self.low, self.high, log=self.log)
        assert self.low is not None and self.high is not None  # a range (checked when the space is read)
        return trial.suggest_float(self.name, float(self.low), float(self.high), log=self.log)

    def record(self) -> dict[str, Any]:
        if self.choices is not None:
            return {"choices": list(self.choices)}
        return {"low": self.low, "high": self.high, "log": self.log}


def space_tables(path: str, labels: list[str], suite: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The search space file's table of each label, checked against the suite's rows: a file that
    cannot be read, or a table for no row or none for a label, is one line. Imports no strategy."""
    try:
        table = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise UserError(f"cannot read search space {path}: {err.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"search space {path} is not valid UTF-8 TOML ({err}); fix the file") from None
    known = {*suite["strategies"], *suite.get("variants", {}), *labels}  # one file may serve several tunes
    if unknown := sorted(set(table) - known):
        raise UserError(
            f"search space {path} has table(s) {unknown} for no row of the suite; rows: {sorted(known)}"
        )
    for label in labels:
        if not table.get(label):
            raise UserError(
                f"search space {path} has no [{label}] table; add e.g. lr = {{low = 1e-4, high = 1e-2}}"
            )
    return {label: table[label] for label in labels}


def read_space(
    path: str, tables: dict[str, dict[str, Any]], suite: dict[str, Any]
) -> dict[str, list[Dimension]]:
    """The dimensions of each label's table (``space_tables``), checked against its strategy's
    Config: an unknown field, a range of the wrong type or an empty one is one line."""
    variants = suite.get("variants", {})
    return {
        label: [
            _dimension(path, label, variants.get(label, {}).get("strategy", label), name, entry)
            for name, entry in table.items()
        ]
        for label, table in tables.items()
    }


def _dimension(path: str, label: str, strategy: str, name: str, entry: Any) -> Dimension:
    from strategies.contract import config_class  # the strategy's module: torch and Avalanche
    from strategies.registry import get_strategy

    where = f"search space {path}: [{label}] {name}"
    cls = config_class(get_strategy(strategy))
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if name not in fields:
        raise UserError(
            f"{where}: {strategy}'s Config has no field {name!r}; valid: {', '.join(sorted(fields))}"
        )
    if not isinstance(entry, dict) or set(entry) not in (
        {"choices"},
        {"low", "high"},
        {"low", "high", "log"},
    ):
        raise UserError(
            f"{where} must be {{low = .., high = ..}} (log = true optional) or {{choices = [..]}}"
        )
    default = fields[name].default
    if "choices" in entry:
        choices = entry["choices"]
        if not isinstance(choices, list) or not choices or any(isinstance(c, (list, dict)) for c in choices):
            raise UserError(f"{where}: choices must be a non-empty list of plain values; got {choices!r}")
        dimension = Dimension(name, choices=tuple(choices))
        values = choices
    else:
        low, high, log = entry["low"], entry["high"], entry.get("log", False)
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high))
        if not numbers or isinstance(default, bool) or not isinstance(default, (int, float)):
            raise UserError(
                f"{where}: a range needs numbers on a numeric field ({name} defaults to {default!r}); "
                f"got low = {low!r}, high = {high!r}"
            )
        if isinstance(default, int) and not (isinstance(low, int) and isinstance(high, int)):
            raise UserError(
                f"{where}: {name} is a whole number; give whole-number low and high, not {low!r}, {high!r}"
            )
        if not isinstance(log, bool) or not low < high or (log and low <= 0):
            raise UserError(f"{where}: needs low < high (and low > 0 with log = true); got {entry!r}")
        if isinstance(default, float):
            low, high = float(low), float(high)
        dimension, values = Dimension(name, low, high, log), [low, high]
    for value in values:  # the Config's own checks, on the ends of the range
        try:
            cls.from_dict({name: value}, strategy)
        except UserError as err:
            raise UserError(f"{where}: {value!r} is refused by {strategy}'s Config ({err})") from None
    return dimension
