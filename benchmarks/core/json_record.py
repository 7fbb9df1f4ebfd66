"""Dataclasses read from and written to JSON objects, each key checked against the fields."""

from __future__ import annotations

from dataclasses import MISSING, Field, field, fields
from typing import Any, ClassVar


def optional_field(default=None):
    """A field that older files may lack: omitted from the JSON while it is None."""
    return field(default=default, metadata={"omit_if_none": True})


def required(f: Field) -> bool:
    """Whether every JSON object of the record must hold ``f`` (it has no default)."""
    return f.default is MISSING and f.default_factory is MISSING


class JsonRecord:
    """``from_json`` and ``to_json`` for a dataclass whose fields are JSON values, or records
    (``RECORD_FIELDS``: a record, or a list of them)."""

    RECORD_FIELDS: ClassVar[dict[str, type[JsonRecord]]] = {}
    __dataclass_fields__: ClassVar[dict[str, Any]]  # a record is a dataclass (what ``fields`` reads)

    @classmethod
    def from_json(cls, data: dict):
        if not isinstance(data, dict):
            raise ValueError(f"{cls.__name__}: expected a JSON object, found {type(data).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        missing = [f.name for f in fields(cls) if f.name not in data and required(f)]
        if unknown or missing:
            problems = [f"missing keys {missing}"] if missing else []
            problems += [f"unknown keys {unknown}"] if unknown else []
            raise ValueError(f"{cls.__name__}: {'; '.join(problems)}")
        values = dict(data)
        for name, record in cls.RECORD_FIELDS.items():
            value = values.get(name)
            if isinstance(value, list):
                values[name] = [record.from_json(item) for item in value]
            elif value is not None:
                values[name] = record.from_json(value)
        return cls(**values)

    def to_json(self) -> dict:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.metadata.get("omit_if_none"):
                continue
            if isinstance(value, list) and value and isinstance(value[0], JsonRecord):
                value = [item.to_json() for item in value]
            elif isinstance(value, JsonRecord):
                value = value.to_json()
            out[f.name] = value
        return out
