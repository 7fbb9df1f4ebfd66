"""What the framework adapters share: a classifier on the run's CLIP backbone, the runner's
keyword arguments, the seen classes, and the learned state in a checkpoint.

``CLIPClassifier`` is the model a framework's strategy trains: the CLIP image tower (frozen, or
tuned through one visual LoRA) and a head with one output per class id of the dataset
(``head = "linear"``: a linear layer; ``"cosine"``: cosine similarity at CLIP's logit scale to
class weights that start at the classes' text features, i.e. at zero-shot CLIP). Logits are over
every class id, as in the frameworks' own class-incremental setups; a class not yet seen simply
has not been trained.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Literal

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.backbone import CLIPBackbone
from benchmarks.core.errors import UserError
from strategies.checkpointing import pack_state, unpack_state
from strategies.config import ConfigT, StrategyConfig
from strategies.settings import RunSettings, take_settings

Head = Literal["linear", "cosine"]
Encoder = Literal["frozen", "lora"]
_ENCODER_ADAPTER = "visual"


@dataclass
class FrameworkConfig(StrategyConfig):
    """The options of every adapter: the model on the backbone, and StrategyConfig's recipe fields
    (epochs, batch_size, lr, optimizer, ...). Avalanche's templates have no mixed precision, so
    they train in fp32 (``amp``) unless ``--precision`` says otherwise."""

    head: Head = "linear"
    encoder: Encoder = "frozen"
    amp: bool = False


class CLIPClassifier(nn.Module):
    """CLIP's image features, then a head over all ``n_classes`` class ids: ``[B, n_classes]``."""

    def __init__(
        self, backbone: CLIPBackbone, class_names: list[str], head: Head, encoder: Encoder, cfg
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.head_kind = head
        if encoder == "lora":
            backbone.add_lora(_ENCODER_ADAPTER, tower="visual", rank=cfg.lora_rank, alpha=cfg.lora_alpha)
            backbone.set_adapters(visual=_ENCODER_ADAPTER, text=None)
            backbone.set_trainable([_ENCODER_ADAPTER])
        else:
            backbone.set_trainable([])
        d, n = backbone.embed_dim, len(class_names)
        if head == "linear":
            self.head = nn.Linear(d, n)
        else:  # the text features of the class prompts: the head starts at zero-shot CLIP
            with torch.no_grad():
                tokens = backbone.tokenize([cfg.prompt_template.format(c) for c in class_names])
                text = backbone.encode_text(tokens.to(backbone.device), normalize=True)
            self.head = nn.Linear(d, n, bias=False)
            self.head.weight.data.copy_(text)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone.encode_image(images, normalize=self.head_kind == "cosine")

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        image = self.features(images)
        if self.head_kind == "linear":
            return self.head(image)
        return self.backbone.logit_scale * image @ F.normalize(self.head.weight, dim=-1).T

    def learned_state(self) -> dict[str, torch.Tensor]:
        """What training can change: the head and the encoder's LoRA (the rest is the backbone's
        pretrained weights, the same in every run)."""
        return {name: p for name, p in self.named_parameters() if p.requires_grad or name.startswith("head.")}


def load_learned_state(model: CLIPClassifier, state: dict[str, torch.Tensor]) -> None:
    """Copy a checkpoint's ``learned_state`` into ``model`` in place (an optimiser keeps its tensors)."""
    parameters = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in state.items():
            parameters[name].copy_(value)


class FrameworkAdapter(Generic[ConfigT]):
    """The contract's core for an adapter: the runner's arguments (``settings``: ``take_settings``, as
    ``CLIPStrategy``'s), ``seen_classes`` in the
    order learned, the progress flag, and checkpoints of ``checkpoint_attributes`` (packed with
    ``strategies.checkpointing.pack_state``: tensors, modules, lists and dicts of them, JSON values).
    A subclass sets ``wrapped`` (the framework's class) and implements ``learn`` and ``scores``."""

    Config: ClassVar[type[StrategyConfig]] = FrameworkConfig
    name: ClassVar[str] = ""
    wrapped: ClassVar[type]
    finishes_pending_images: ClassVar[bool] = False
    checkpoint_attributes: ClassVar[tuple[str, ...]] = ("seen_classes",)
    seen_classes: list[int]  # set per instance
    # set per instance by take_settings, as on CLIPStrategy: the settings read whole, and the device
    # as a torch device
    settings: RunSettings
    device: torch.device
    cfg: ConfigT
    backbone: CLIPBackbone

    def __init__(
        self,
        *,
        backbone: CLIPBackbone,
        class_names: list[str],
        config: StrategyConfig,
        settings: RunSettings | None = None,
        plugins: list | None = None,
    ) -> None:
        take_settings(self, backbone, config, settings)
        self.class_names = list(class_names)
        self.plugins = list(plugins or [])
        self.seen_classes: list[int] = []
        self.train_iterations = 0  # this process's steps: the runner adds those before a resume

    def framework_options(self) -> dict[str, Any]:
        """The config's fields the wrapped class takes itself (those below ``FrameworkConfig``)."""
        shared = {f.name for f in dataclasses.fields(FrameworkConfig)}
        return {k: v for k, v in self.cfg.to_dict().items() if k not in shared}

    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors, kinds = {}, {}
        for attr in self.checkpoint_attributes:
            kind, packed = pack_state(self._state_value(attr))
            kinds[attr] = kind
            tensors.update({f"state/{attr}{suffix}": t for suffix, t in packed.items()})
        return tensors, {"attributes": kinds}

    def load_checkpoint_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        for attr, kind in meta["attributes"].items():
            prefix = f"state/{attr}"
            packed = {
                k[len(prefix) :]: t for k, t in tensors.items() if k == prefix or k.startswith(prefix + "/")
            }
            self._restore_value(attr, unpack_state(kind, packed, self._state_value(attr)))

    def _state_value(self, attr: str):
        value = getattr(self, attr)
        if isinstance(value, CLIPClassifier):  # its learned part; the backbone is rebuilt per run
            return value.learned_state()
        return value

    def _restore_value(self, attr: str, value) -> None:
        current = getattr(self, attr, None)
        if isinstance(current, CLIPClassifier):
            load_learned_state(current, value)
        elif not isinstance(current, nn.Module):  # a module: unpack_state loaded it in place
            setattr(self, attr, value)

    def trainable_parameter_count(self) -> int | None:
        return None


def declared_config(cls: type) -> type[FrameworkConfig]:
    """The learner's own ``Config`` where it subclasses ``FrameworkConfig``, else ``FrameworkConfig``."""
    config = getattr(cls, "Config", None)
    if isinstance(config, type) and issubclass(config, FrameworkConfig):
        return config
    return FrameworkConfig


def task_classes(experience, n_classes: int, seen: list[int], name: str) -> list[int]:
    """The experience's class ids in the run's class order (``classes_in_order``, which the suite's
    streams carry; sorted for another stream); ids outside the dataset or learned before are one line."""
    in_order = getattr(experience, "classes_in_order", None)
    classes = (
        [int(c) for c in in_order]
        if in_order
        else sorted(int(c) for c in experience.classes_in_this_experience)
    )
    unknown = [c for c in classes if not 0 <= c < n_classes]
    if unknown:
        raise UserError(
            f"{name}: the experience holds class ids {unknown[:5]} outside the {n_classes} classes of "
            "class_names; give a stream of the run's dataset (ids 0..n_classes-1, not remapped)"
        )
    again = sorted(set(classes) & set(seen))
    if again:
        raise UserError(f"{name}: classes {again[:5]} arrive in a second task; tasks must be disjoint")
    return classes


def refuse_plugins(name: str, plugins: list) -> None:
    """One line for Avalanche plugins given to an adapter whose framework runs its own training loop,
    where they would never run. The runner gives such a strategy none: its live log holds the
    stages only, and the run warns so (``benchmarks.runner.learning.training_log``)."""
    if plugins:
        given = ", ".join(type(plugin).__name__ for plugin in plugins)
        raise UserError(
            f"{name}: its training loop is its own, so Avalanche plugins ({given}) cannot attach to it; "
            "give it none (its live log, --log, holds its stages, not its training iterations)"
        )
