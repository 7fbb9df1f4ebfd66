"""What the ``pycil:`` adapter's checkpoints hold beside a learner's network, and how they are read
back: the network's shapes and plain tensors (what a resume can rebuild), a module's trainable
parameters and mode, tensors off the CPU, and state dicts loaded exactly."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def module_mode(module: nn.Module) -> dict[str, Any]:
    """What a module's state dict leaves out: which parameters train, and its mode."""
    trainable = [name for name, parameter in module.named_parameters() if parameter.requires_grad]
    return {"trainable": trainable, "training": module.training}


def set_mode(module: nn.Module, mode: dict[str, Any]) -> None:
    for name, parameter in module.named_parameters():
        parameter.requires_grad_(name in mode["trainable"])
    module.train(mode["training"])


def class_name(module: nn.Module) -> str:
    return f"{type(module).__module__}.{type(module).__qualname__}"


def on_accelerator(value: Any) -> bool:
    """Whether ``value`` (a tensor, or lists, tuples and dicts of them) holds a tensor off the CPU."""
    if isinstance(value, torch.Tensor):
        return value.device.type != "cpu"
    if isinstance(value, (list, tuple)):
        return any(on_accelerator(v) for v in value)
    if isinstance(value, dict):
        return any(on_accelerator(v) for v in value.values())
    return False


def to_device(value: Any, device: torch.device) -> Any:
    """``value`` with its tensors moved to ``device``, its lists, tuples and dicts kept."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(to_device(v, device) for v in value)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    return value


def state_shapes(network: nn.Module) -> dict[str, list[int]]:
    """Each state dict key's shape, as a checkpoint's JSON holds it."""
    return {key: list(value.shape) for key, value in network.state_dict().items()}


def plain_tensors(network: nn.Module) -> list[str]:
    """The tensors a network and its modules hold as plain attributes, outside their state dict."""
    return sorted(
        f"{prefix}.{attr}" if prefix else attr
        for prefix, module in network.named_modules()
        for attr, value in vars(module).items()
        if isinstance(value, torch.Tensor)
    )


def modules_outside_state_dict(network: nn.Module) -> dict[str, list[nn.Module]]:
    """The modules a network and its modules hold in plain lists, tuples or dicts, by the path of
    the attribute holding them, where the network's state dict does not see them (C3Box's EASE
    keeps each task's trained adapters in ``backbone.adapter_list``, a list). Modules registered
    elsewhere in the network (a list that names its own blocks) are left out."""
    registered = {id(module) for module in network.modules()}
    found: dict[str, list[nn.Module]] = {}
    for prefix, module in network.named_modules():
        for attr, value in vars(module).items():
            if attr in ("_modules", "_parameters", "_buffers") or not isinstance(value, (list, tuple, dict)):
                continue
            items = value.values() if isinstance(value, dict) else value
            outside = [v for v in items if isinstance(v, nn.Module) and id(v) not in registered]
            if outside:
                found[f"{prefix}.{attr}" if prefix else attr] = outside
    return found


def tensors_as_built(modules: dict[str, list[nn.Module]]) -> dict[int, tuple[torch.Tensor, int]]:
    """Each tensor of ``modules`` by id, with its version counter: what ``changed_outside`` compares."""
    return {
        id(t): (t, t._version)
        for held in modules.values()
        for module in held
        for t in module.state_dict(keep_vars=True).values()
    }


def fingerprint(module: nn.Module) -> tuple:
    """A module's state by value, small enough to keep: each key's shape and the sum and sum of
    squares of its values (in float64). Two modules with the same fingerprint hold the same state."""
    return tuple(
        (key, tuple(t.shape), float(t.double().sum()), float(t.double().square().sum()))
        for key, t in sorted(module.state_dict().items())
    )


def changed_outside(
    network: nn.Module, built: dict[int, tuple[torch.Tensor, int]], pristine: frozenset[tuple] = frozenset()
) -> list[str]:
    """The attributes of ``network`` holding modules outside its state dict that hold state a
    checkpoint would lose: a module made since ``built`` was taken, or one trained since (a tensor
    changed in place), unless it equals one of the ``pristine`` fingerprints (a fresh copy of the
    run's CLIP). An untouched one (C3Box's networks keep the first of the two CLIPs its factory
    builds in a tuple, and the run's backbone in their ``args``) loses nothing."""
    lost = []
    for path, modules in modules_outside_state_dict(network).items():
        if not all(_as_built(module, built) or fingerprint(module) in pristine for module in modules):
            lost.append(f"_network.{path} ({len(modules)} module(s) outside its state dict)")
    return sorted(lost)


def _as_built(module: nn.Module, built: dict[int, tuple[torch.Tensor, int]]) -> bool:
    return all(
        (mine := built.get(id(t))) is not None and mine[0] is t and t._version == mine[1]
        for t in module.state_dict(keep_vars=True).values()
    )


def load_exactly(module: nn.Module, state: dict[str, torch.Tensor], untouched, name: str) -> None:
    """``state`` into ``module``; any key missing (other than ``untouched``, when given) or extra is
    a checkpoint that does not fit."""
    loaded = module.load_state_dict(state, strict=False)
    lost = [] if untouched is None else sorted(set(loaded.missing_keys) - set(untouched))
    if lost or loaded.unexpected_keys:
        raise ValueError(
            f"{name}: the checkpoint does not fit the learner's network (missing {lost[:3]}, "
            f"unexpected {loaded.unexpected_keys[:3]}); rebuild the network's modules in __init__"
        )


def packed_under(tensors: dict[str, torch.Tensor], prefix: str, sep: str = "/") -> dict[str, torch.Tensor]:
    """The tensors saved under ``prefix``, keyed by what follows it."""
    if not sep:
        return {k[len(prefix) :]: t for k, t in tensors.items() if k.startswith(prefix)}
    return {k[len(prefix) :]: t for k, t in tensors.items() if k == prefix or k.startswith(prefix + sep)}
