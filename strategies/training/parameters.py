"""Parameter discovery: what a strategy trains, found without a hook, and counted over the stream."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from strategies.training.host import StrategyHost

# The step's references to what it optimises, not more of it.
_BOOKKEEPING = ("optimized_tensors",)


class TrainableParameters(StrategyHost):
    """Mixin of ``CLIPStrategy``: every ``nn.Parameter`` with ``requires_grad`` that it holds is
    optimised, and counted once over the stream (``optimized_parameters``: name -> size of every
    tensor an optimiser held, which ``make_optimizer`` adds to and checkpoints keep). Reads
    ``backbone`` and ``adapters``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.optimized_parameters: dict[str, int] = {}

    def trainable_parameters(self) -> dict[str, torch.Tensor]:
        """What the task's optimiser holds, by name: the backbone's parameters with ``requires_grad``,
        ``extra_trainable_parameters``, then every other ``nn.Parameter`` with ``requires_grad`` that
        the strategy holds (an attribute, or in a module, list, tuple or dict attribute)."""
        named: dict[str, torch.Tensor] = {}
        seen: set[int] = set()

        def add(name: str, p: torch.Tensor) -> None:
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                named[name] = p

        for name, parameter in self.backbone.named_parameters():
            add(f"backbone.{name}", parameter)
        for i, tensor in enumerate(self.extra_trainable_parameters()):
            add(f"extra_trainable_parameters.{i}", tensor)
        for name, held in held_parameters(self):
            add(name, held)
        return named

    def extra_trainable_parameters(self) -> list[torch.nn.Parameter]:
        """Trainable tensors the attribute scan of ``trainable_parameters`` does not find (e.g. held
        by a closure); empty by default. Parameters held as attributes need no entry here."""
        return []

    def lora_parameter_count(self) -> int:
        """The parameters of every LoRA adapter, each counted once (for a strategy that counts its
        learned state its own way in ``trainable_parameter_count``)."""
        return sum(p.numel() for name in self.adapters for p in self.backbone.lora_parameters(name))

    def trainable_parameter_count(self) -> int:
        """Parameters learned over the whole stream: every tensor an optimiser of the base held in
        any task, counted once (``optimized_parameters``), and every LoRA adapter."""
        counted = dict(self.optimized_parameters)
        if self.adapters:  # an adapter restored from a checkpoint was trained before it
            names = {id(p): f"backbone.{path}" for path, p in self.backbone.named_parameters()}
            for adapter in self.adapters:
                for p in self.backbone.lora_parameters(adapter):
                    counted.setdefault(names[id(p)], p.numel())
        return sum(counted.values())


def held_parameters(strategy) -> Iterator[tuple[str, torch.Tensor]]:
    """Every ``nn.Parameter`` the strategy holds outside its backbone, with a name: attributes, the
    parameters of module attributes, and parameters or modules in list, tuple or dict attributes
    (one level). Plain tensors are left out: a tensor with ``requires_grad`` may be a step's own
    leaf (e.g. a chunked backward's), not something to learn."""
    for attr, value in vars(strategy).items():
        if value is strategy.backbone or value is strategy.model or attr in _BOOKKEEPING:
            continue
        items = (
            value.items()
            if isinstance(value, dict)
            else enumerate(value)
            if isinstance(value, (list, tuple))
            else [(None, value)]
        )
        for key, item in items:
            name = attr if key is None else f"{attr}.{key}"
            if isinstance(item, torch.nn.Parameter):
                yield name, item
            elif isinstance(item, torch.nn.Module) and item is not strategy.backbone:
                for sub, p in item.named_parameters():
                    yield f"{name}.{sub}", p
