"""LoRA adapters (peft) on the key and value projections of one tower each, as a mixin of
``CLIPBackbone``: adding, activating, training, copying and saving named adapters, and running
one image batch under several visual adapters at once (peft's mixed-adapter batches)."""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Iterable, Iterator
from typing import Any, Literal, cast

import torch
from peft import LoraConfig, inject_adapter_in_model
from peft.tuners.lora import LoraLayer
from torch import nn

from benchmarks.backbone.open_clip_types import OpenCLIP
from benchmarks.core.errors import UserError

LORA_INITS = ("kaiming", "xavier")  # initialisations of LoRA's A (B is always 0)
BASE_ADAPTER = "__base__"  # peft's name for "no adapter" in a mixed-adapter batch
Tower = Literal["visual", "text"]
# Module paths (relative to the open_clip model) of the projections that get LoRA, per tower.
# peft matches a string target with re.fullmatch, so the text pattern cannot match visual.*.
_LORA_TARGETS: dict[str, str] = {
    "visual": r"visual\.transformer\.resblocks\.\d+\.attn\.(k_proj|v_proj)",
    "text": r"transformer\.resblocks\.\d+\.attn\.(k_proj|v_proj)",
}


class LoRAAdapters:
    """Adapter bookkeeping of ``CLIPBackbone`` (which sets ``model``, ``_towers``, ``_active`` and
    ``_trainable``). peft flips ``requires_grad`` whenever an adapter is added or activated, so the
    active adapters and the trainable set are re-applied after every peft call."""

    model: OpenCLIP
    _towers: dict[str, Tower]
    _active: dict[Tower, str | None]
    _trainable: set[str]

    @contextlib.contextmanager
    def _only_visual_adapter(self, name: str | None) -> Iterator[None]:
        """A plain forward under one visual adapter (no mixed-batch bookkeeping), then restore."""
        active = self.active_adapters
        self.set_adapters(visual=name, text=active["text"])
        try:
            yield
        finally:
            self.set_adapters(**active)

    @contextlib.contextmanager
    def _mixed_adapter_batch(self, per_sample: list[str]) -> Iterator[None]:
        # What peft's LoraModel._enable_peft_forward_hooks does, restricted to the visual tower and
        # without its training-mode guard: a pre-hook hands `adapter_names` to LoraLayer.forward,
        # which then runs LoraLayer._mixed_batch_forward.
        def inject(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            return args, {**kwargs, "adapter_names": per_sample}

        handles = [
            _module(layer).register_forward_pre_hook(inject, with_kwargs=True)
            for layer in self._lora_layers("visual")
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def add_lora(
        self, name: str, tower: Tower, rank: int = 24, alpha: float = 1.0, init_a: str = "kaiming"
    ) -> None:
        """Add a LoRA (B = 0, so initially the identity) on k/v of every block of ``tower``; not activated.

        ``init_a`` initialises A: "kaiming" is peft's default (kaiming-uniform, a = sqrt(5)),
        "xavier" is ``xavier_uniform_`` (MG-CLIP). It draws from torch's global generator.
        """
        if tower not in _LORA_TARGETS:
            raise ValueError(f"tower must be 'visual' or 'text', got {tower!r}")
        if init_a not in LORA_INITS:
            raise ValueError(f"init_a must be one of {LORA_INITS}, got {init_a!r}")
        if name in self._towers or name == BASE_ADAPTER:
            raise ValueError(f"adapter name {name!r} is taken")
        config = LoraConfig(
            r=rank,
            lora_alpha=alpha,  # type: ignore[arg-type]  # peft types it int; it takes a float
            lora_dropout=0.0,
            target_modules=_LORA_TARGETS[tower],
            bias="none",
        )
        with warnings.catch_warnings():
            # Several adapters on one model is the point here, not an accident peft should warn about.
            warnings.filterwarnings("ignore", message="Already found a `peft_config` attribute")
            inject_adapter_in_model(config, self.model, adapter_name=name)
        self._towers[name] = tower
        if init_a == "xavier":
            with torch.no_grad():
                for _, layer in self._named_lora_layers(tower):
                    nn.init.xavier_uniform_(_weights(layer, name)[0])
        self._sync_adapter_state()

    def adapter_names(self, tower: Tower) -> list[str]:
        """Adapters of ``tower`` in creation order."""
        return [name for name, t in self._towers.items() if t == tower]

    def set_adapters(self, visual: str | None, text: str | None) -> None:
        """Choose the active adapter of each tower (None = base weights); trainability is unchanged."""
        chosen: tuple[tuple[str | None, Tower], ...] = ((visual, "visual"), (text, "text"))
        for name, tower in chosen:
            if name is not None:
                self._check_adapter(name, tower)
        self._active = {"visual": visual, "text": text}
        self._sync_adapter_state()

    @property
    def active_adapters(self) -> dict[Tower, str | None]:
        return dict(self._active)

    def set_trainable(self, names: Iterable[str]) -> None:
        """Make exactly the LoRA parameters of ``names`` trainable; everything else is frozen."""
        names = set(names)
        for name in names:
            self._check_adapter(name)
        self._trainable = names
        self._sync_adapter_state()

    def lora_parameters(self, name: str) -> list[nn.Parameter]:
        """The LoRA A and B weights of adapter ``name``, in module order."""
        tower = self._check_adapter(name)
        return [param for _, layer in self._named_lora_layers(tower) for param in _weights(layer, name)]

    def copy_lora(self, src: str, dst: str) -> None:
        """Overwrite the weights of adapter ``dst`` with those of ``src`` (same tower, rank and alpha)."""
        tower = self._check_adapter(src)
        self._check_adapter(dst, tower)
        with torch.no_grad():
            for path, layer in self._named_lora_layers(tower):
                if layer.r[src] != layer.r[dst] or layer.scaling[src] != layer.scaling[dst]:
                    raise ValueError(f"cannot copy LoRA {src!r} to {dst!r}: rank or alpha differ at {path}")
                for to, source in zip(_weights(layer, dst), _weights(layer, src), strict=True):
                    to.copy_(source)

    def lora_state_dict(self, name: str) -> dict[str, torch.Tensor]:
        """Adapter weights as CPU tensors keyed ``<module path>.lora_A`` / ``.lora_B``
        (no adapter name in keys)."""
        tower = self._check_adapter(name)
        state: dict[str, torch.Tensor] = {}
        for path, layer in self._named_lora_layers(tower):
            lora_a, lora_b = _weights(layer, name)
            state[f"{path}.lora_A"] = lora_a.detach().cpu().clone()
            state[f"{path}.lora_B"] = lora_b.detach().cpu().clone()
        return state

    def load_lora_state_dict(self, name: str, state: dict[str, torch.Tensor]) -> None:
        """Load weights saved by ``lora_state_dict`` into the existing adapter ``name``."""
        tower = self._check_adapter(name)
        targets = {
            f"{path}.{kind}": getattr(layer, kind)[name].weight
            for path, layer in self._named_lora_layers(tower)
            for kind in ("lora_A", "lora_B")
        }
        missing, unexpected = targets.keys() - state.keys(), state.keys() - targets.keys()
        if missing or unexpected:
            raise UserError(
                f"LoRA state for {name!r} does not match the model: {len(missing)} missing keys "
                f"(e.g. {sorted(missing)[:1]}), {len(unexpected)} unexpected (e.g. {sorted(unexpected)[:1]})"
            )
        with torch.no_grad():
            for key, param in targets.items():
                if state[key].shape != param.shape:
                    raise UserError(
                        f"LoRA state {key}: shape {tuple(state[key].shape)} != {tuple(param.shape)}"
                    )
                param.copy_(state[key])

    # ---- internals

    def _check_adapter(self, name: str, tower: Tower | None = None) -> Tower:
        if name not in self._towers:
            raise KeyError(f"unknown adapter {name!r}; known: {sorted(self._towers)}")
        if tower is not None and self._towers[name] != tower:
            raise ValueError(f"adapter {name!r} belongs to the {self._towers[name]} tower, not {tower}")
        return self._towers[name]

    def _named_lora_layers(self, tower: Tower) -> list[tuple[str, LoraLayer]]:
        pattern = _LORA_TARGETS[tower]
        return [
            (path, module)
            for path, module in self.model.named_modules()
            if isinstance(module, LoraLayer) and re.fullmatch(pattern, path)
        ]

    def _lora_layers(self, tower: Tower) -> list[LoraLayer]:
        return [layer for _, layer in self._named_lora_layers(tower)]

    def _sync_adapter_state(self) -> None:
        """Re-apply the active adapter of each tower and the trainable set to every LoRA layer."""
        for tower in ("visual", "text"):
            active = self._active[tower]
            for layer in self._lora_layers(tower):
                layer.set_adapter([active] if active is not None else [])
                for adapter, module in (*layer.lora_A.items(), *layer.lora_B.items()):
                    module.requires_grad_(adapter in self._trainable)


def _weights(layer: LoraLayer, name: str) -> tuple[nn.Parameter, nn.Parameter]:
    """The A and B weights of adapter ``name`` at ``layer`` (peft keeps each an ``nn.Linear`` in a
    ``ModuleDict``, which its types leave as ``Module``)."""
    lora_a, lora_b = layer.lora_A[name], layer.lora_B[name]
    assert isinstance(lora_a, nn.Linear) and isinstance(lora_b, nn.Linear)
    return cast(nn.Parameter, lora_a.weight), cast(nn.Parameter, lora_b.weight)


def _module(layer: LoraLayer) -> nn.Module:
    """A LoRA layer as the module it is (peft's types give ``LoraLayer`` no ``nn.Module`` base)."""
    assert isinstance(layer, nn.Module)
    return layer
