"""A strategy's learned state on disk: the checkpoint after every task, and a saved model.

Tensors go to safetensors (never pickle) and everything else to JSON. ``strategy_state`` collects
the LoRA adapters and the attributes a strategy names in ``checkpoint_attributes`` (each packed
by ``pack_state``), with the class bookkeeping and the loss scaler; ``load_strategy_state``
restores them. ``save_model`` and ``load_model`` write and read the same as two files.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import torch

from benchmarks.core.atomic_io import read_json, read_tensors, write_json, write_tensors

StateValue = torch.Tensor | list | dict | torch.nn.Module | torch.dtype | int | float | str | bool | None
#: how ``unpack_state`` rebuilds a value: a name ("tensor", "list", ...), or for a value with parts
#: that are not tensors a JSON dict that holds those parts (kinds "dataclasses" and "json")
StateKind = str | dict[str, Any]


def _cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu().contiguous()


def pack_state(value: StateValue) -> tuple[StateKind, dict[str, torch.Tensor]]:
    """A strategy attribute as ``(kind, {key suffix: CPU tensor})`` for a checkpoint; the kind is
    JSON, stored in the metadata.

    A tensor is saved under "" (key ``state/<name>``), a list of tensors under "/<i>", a dict of
    tensors under "/<key>", a module under "/<state_dict key>"; None saves nothing. A list of
    dataclasses (one class) saves each item's tensor fields under "/<i>/<field>" and its other
    fields, JSON values, in the kind; a list of tuples (or lists) of tensors, each item under
    "/<i>/<j>" (RAPF's per-class distances). A value without tensors (ids, per-epoch statistics:
    JSON) is kept whole in the kind, a ``torch.dtype`` by its name. ``unpack_state`` inverts it.
    """
    if value is None:
        return "none", {}
    if isinstance(value, torch.Tensor):
        return "tensor", {"": _cpu(value)}
    if isinstance(value, torch.nn.Module):
        return "module", {f"/{k}": _cpu(v) for k, v in value.state_dict().items()}
    if isinstance(value, (list, tuple)) and all(isinstance(v, torch.Tensor) for v in value):
        return "list", {f"/{i}": _cpu(v) for i, v in enumerate(value)}
    if isinstance(value, dict) and all(isinstance(v, torch.Tensor) for v in value.values()):
        return "dict", {f"/{k}": _cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and all(_is_dataclass_instance(v) for v in value):
        return _pack_dataclasses(value)
    if isinstance(value, (list, tuple)) and all(_is_tensor_row(v) for v in value):
        rows = [{"length": len(row), "tuple": isinstance(row, tuple)} for row in value]
        return {"kind": "rows", "rows": rows}, {
            f"/{i}/{j}": _cpu(tensor) for i, row in enumerate(value) for j, tensor in enumerate(row)
        }
    if isinstance(value, torch.dtype):
        return {"kind": "dtype", "value": str(value).removeprefix("torch.")}, {}
    return {"kind": "json", "value": _json_value(value)}, {}


def _is_tensor_row(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(v, torch.Tensor) for v in value)


def _is_dataclass_instance(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _json_value(value: Any) -> Any:
    """A copy of ``value`` as the metadata's JSON gives it back (a tuple becomes a list), so a state
    loaded from memory equals one loaded from disk and shares nothing with the strategy."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError):
        raise TypeError(
            f"cannot checkpoint a {type(value).__name__} holding {value!r:.80}; use tensors, lists or "
            "dicts of them, a module, a list of dataclasses of tensors and JSON values, or JSON values"
        ) from None


def _pack_dataclasses(items: list | tuple) -> tuple[StateKind, dict[str, torch.Tensor]]:
    """Tensor fields of item ``i`` go under "/<i>/<field>"; the other fields stay in the kind."""
    classes = {type(item) for item in items}
    if len(classes) > 1:
        names = sorted(c.__name__ for c in classes)
        raise TypeError(f"cannot checkpoint a list of different dataclasses ({', '.join(names)})")
    (cls,) = classes
    tensors, rows = {}, []
    for i, item in enumerate(items):
        row = {}
        for f in dataclasses.fields(item):
            value = getattr(item, f.name)
            if isinstance(value, torch.Tensor):
                tensors[f"/{i}/{f.name}"] = _cpu(value)
            else:
                row[f.name] = _json_value(value)
        rows.append(row)
    return {"kind": "dataclasses", "class": f"{cls.__module__}:{cls.__qualname__}", "items": rows}, tensors


def _unpack_dataclasses(kind: dict[str, Any], packed: dict[str, torch.Tensor]) -> list:
    cls = _loaded_dataclass(kind["class"])
    init = {f.name for f in dataclasses.fields(cls) if f.init}
    items = []
    for i, row in enumerate(kind["items"]):
        prefix = f"/{i}/"
        tensors = {k[len(prefix) :]: v for k, v in packed.items() if k.startswith(prefix)}
        fields = {**_json_value(row), **tensors}
        item = cls(**{k: v for k, v in fields.items() if k in init})
        for name in fields.keys() - init:
            setattr(item, name, fields[name])
        items.append(item)
    return items


# A checkpoint written before the methods moved into strategies/methods/ names a method's module
# as strategies.<name>; it still resumes.
_MOVED_FROM, _MOVED_TO = "strategies.", "strategies.methods."


def _loaded_dataclass(name: str) -> type:
    """The dataclass ``module:QualName`` names, from a module already imported (the strategy's own):
    loading a checkpoint imports nothing that its metadata names."""
    module_name, _, qualname = name.partition(":")
    found = sys.modules.get(module_name)
    if found is None and module_name.startswith(_MOVED_FROM):
        found = sys.modules.get(_MOVED_TO + module_name.removeprefix(_MOVED_FROM))
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if not (isinstance(found, type) and dataclasses.is_dataclass(found)):
        raise ValueError(
            f"a checkpoint holds items of dataclass {name!r}, which no imported module defines; "
            "import the strategy that saved it first"
        )
    return found


def unpack_state(kind: StateKind, packed: dict[str, torch.Tensor], current: StateValue = None) -> StateValue:
    """The value ``pack_state`` saved. A module, or a tensor into an ``nn.Parameter`` of its shape, is
    loaded into ``current`` (the strategy re-creates it before loading, e.g. in ``__init__``) and
    returned."""
    if isinstance(kind, dict):
        if kind["kind"] == "json":
            return _json_value(kind["value"])
        if kind["kind"] == "dataclasses":
            return _unpack_dataclasses(kind, packed)
        if kind["kind"] == "rows":
            rows = [[packed[f"/{i}/{j}"] for j in range(row["length"])] for i, row in enumerate(kind["rows"])]
            return [tuple(r) if row["tuple"] else r for r, row in zip(rows, kind["rows"], strict=True)]
        if kind["kind"] == "dtype":
            dtype = getattr(torch, kind["value"], None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"unknown torch dtype {kind['value']!r} in a checkpoint")
            return dtype
        raise ValueError(f"unknown checkpoint state kind {kind['kind']!r}")
    if kind == "none":
        return None
    if kind == "tensor":
        if isinstance(current, torch.nn.Parameter) and current.shape == packed[""].shape:
            with torch.no_grad():  # the same object, so it stays in the optimiser and trainable
                current.copy_(packed[""])
            return current
        return packed[""]
    items = {k[1:]: v for k, v in packed.items()}
    if kind == "list":
        return [items[str(i)] for i in range(len(items))]
    if kind == "dict":
        return items
    if kind == "module":
        if not isinstance(current, torch.nn.Module):
            raise ValueError("a checkpointed module needs the strategy to re-create it before loading")
        current.load_state_dict(items)
        return current
    raise ValueError(f"unknown checkpoint state kind {kind!r}")


def strategy_state(strategy) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Tensors (for safetensors) and JSON metadata that restore ``strategy`` after a task.

    Keys: ``lora/<adapter>/<key>`` for every LoRA adapter, and ``state/<name>...`` for each
    attribute in ``checkpoint_attributes`` (``pack_state``), whose kinds, with any JSON parts, are
    the metadata's ``state_kinds``.
    """
    tensors = {
        f"lora/{name}/{key}": _cpu(value)
        for name in strategy.adapters
        for key, value in strategy.backbone.lora_state_dict(name).items()
    }
    kinds = {}
    for name in strategy.checkpoint_attributes:
        kinds[name], packed = pack_state(getattr(strategy, name))
        tensors.update({f"state/{name}{key}": value for key, value in packed.items()})
    meta = {
        "seen_classes": strategy.seen_classes,
        "task_classes": strategy.task_classes,
        "adapters": strategy.adapters,
        "loss_scaler": strategy.scaler.state_dict(),
        "skipped_steps": strategy.skipped_steps,
        "optimized_parameters": strategy.optimized_parameters,
        "state_kinds": kinds,
    }
    return tensors, meta


def load_strategy_state(strategy, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Restore what ``strategy_state`` returned: LoRA adapters (re-created where missing), the
    attributes, the class bookkeeping and the loss scaler."""
    strategy.seen_classes = list(meta["seen_classes"])
    strategy.task_classes = [list(c) for c in meta["task_classes"]]
    if meta.get("loss_scaler") and strategy.scaler.is_enabled():  # {} when saved without fp16
        strategy.scaler.load_state_dict(meta["loss_scaler"])
    strategy.skipped_steps = int(meta.get("skipped_steps", 0))
    strategy.optimized_parameters = dict(meta.get("optimized_parameters", {}))
    for name, spec in meta["adapters"].items():
        if name not in strategy.adapters:
            strategy.backbone.add_lora(name, tower=spec["tower"], rank=spec["rank"], alpha=spec["alpha"])
            strategy.adapters[name] = dict(spec)
        prefix = f"lora/{name}/"
        state = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        strategy.backbone.load_lora_state_dict(name, state)
    for name, kind in meta.get("state_kinds", {}).items():
        prefix = f"state/{name}"
        packed = {
            k[len(prefix) :]: v for k, v in tensors.items() if k == prefix or k.startswith(prefix + "/")
        }
        current = getattr(strategy, name, None)
        restored = unpack_state(kind, packed, current)
        if restored is not current:  # a module or a parameter is loaded in place
            setattr(strategy, name, restored)


def save_model(strategy, path: str | Path, extra: dict[str, Any] | None = None) -> None:
    """Write the learned state as ``PATH.safetensors`` plus ``PATH.json`` (metadata); PATH is
    taken as a name stem, so ``run.model`` gives ``run.model.safetensors`` and ``run.model.json``.

    The tensor keys are documented by ``strategy_state``; they can be read without this
    suite via ``safetensors.safe_open`` (a tensor held under several names is saved under the first,
    and the file's ``shared_tensors`` metadata names the others). Both files are written atomically.
    """
    path = Path(path)
    tensors, meta = strategy.checkpoint_state()
    write_tensors(path.with_name(path.name + ".safetensors"), tensors)
    write_json(
        path.with_name(path.name + ".json"),
        {
            "strategy": strategy.name,
            "config": strategy.cfg.to_dict(),
            "class_names": strategy.class_names,
            "state": meta,
            **(extra or {}),
        },
    )


def load_model(strategy, path: str | Path) -> None:
    """Restore what ``save_model`` wrote (tensors are read with safetensors, never pickle)."""
    path = Path(path)
    meta = read_json(path.with_name(path.name + ".json"))
    strategy.load_checkpoint_state(read_tensors(path.with_name(path.name + ".safetensors")), meta["state"])
