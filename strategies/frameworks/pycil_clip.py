"""C3Box's CLIP learners (LAMDA-CL/C3Box) under the ``pycil:`` adapter, unchanged.

C3Box builds its networks on a whole CLIP, not an image tower: its factory ``get_convnet(args)``
calls ``open_clip.create_model_and_transforms`` and returns ``(model, preprocess, tokenizer)``, and
its learners read class names and prompt templates from their DataManager and predict through their
own ``_eval_cnn(loader)``. A checkout whose factory is of that kind (``builds_whole_clip``) runs in
C3Box's shape (``C3BoxShape``), and the adapter gives it:

- **the model**: each call of the factory (a network calls it twice) gets a trainable copy of the
  run's open_clip CLIP (``RunCLIP``), its ``out_dim`` the run's embedding width, the run's
  tokenizer and an eval transform; a network that calls ``open_clip.create_model_and_transforms``
  itself gets the same, never a download;
- **its DataManager's names**: ``_class_to_label`` (the seen classes' names by position),
  ``_data_to_prompt`` (the run's ``prompt_template``), ``dataset_name``, ``concept_order`` and
  C3Box's own ``get_attributes``/``get_prefix`` (CLG-CBM's concept lists, read from the checkout);
- **task sizes**: ``init_cls`` and ``increment`` in ``args``, from the stream;
- **its ``.cuda()`` calls** on the run's device, where that is not a GPU (said once);
- **a working directory of its own** for each run, with the checkout's ``utils/`` reachable
  (ENGINE's descriptions, CLG-CBM's concepts are read relative to it; files it writes stay there),
  and the run's CLIP weights where C3Box's PTM networks load theirs (``./c.pth``, TUNA's
  ``.p/c.pth``), as the state dict of the model its factory gets;
- **scores**: the logits its ``_eval_cnn`` ranks (captured at its ``torch.topk``) over the seen
  classes, for each batch the runner scores.
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import FunctionType, ModuleType
from typing import Any
from unittest import mock

import open_clip
import torch
from torch import nn

from benchmarks.backbone import fuse_attention_
from benchmarks.core.atomic_io import owned_temp_dir
from benchmarks.core.errors import UserError

TORCH_LOAD = torch.load  # the real one, called by the watch that stands in for it

# What C3Box's DataManager reads from its labels.json and templates.json, here from the run.
TASK_SIZE_ARGS = ("init_cls", "increment")
# Where C3Box's PTM networks (utils/inc_net.py: APER's, EASE's, the prompt methods', MEMO's, TUNA's)
# load their CLIP's state dict from, relative to the working directory.
CLIP_STATE_FILES = ("c.pth", ".p/c.pth")
# ...and rebuild its image tower from that state dict with `heads = width // 64` (ViT-B/16's and
# ViT-L/14's head width), loading it with strict=False: a CLIP of other heads is silently another model.
C3BOX_HEAD_WIDTH = 64


def builds_whole_clip(factory: FunctionType) -> bool:
    """Whether ``factory`` builds open_clip's whole CLIP itself (C3Box's ``get_convnet``, which
    answers ``(model, preprocess, tokenizer)``), as its code names both calls."""
    names = factory.__code__.co_names
    return "create_model_and_transforms" in names and "get_tokenizer" in names


def whole_clip_factories(modules: list[ModuleType]) -> list[FunctionType]:
    """The factories named ``get_convnet`` in ``modules`` that build a whole CLIP."""
    found = []
    for module in modules:
        fn = vars(module).get("get_convnet")
        if isinstance(fn, FunctionType) and fn.__module__ == module.__name__ and builds_whole_clip(fn):
            found.append(fn)
    return found


class RunCLIP:
    """The run's CLIP as C3Box's factory gives it: each call a trainable copy of the backbone's
    open_clip model in open_clip's own layout (fused attention, as ``create_model_and_transforms``
    builds it; ``out_dim`` its embedding width), an eval transform and the run's tokenizer."""

    def __init__(self, backbone: nn.Module) -> None:
        self.backbone = backbone

    def model(self) -> nn.Module:
        model: Any = copy.deepcopy(self.backbone.model)  # an open_clip CLIP, given out_dim below
        fuse_attention_(model)  # C3Box counts `attn.in_proj_weight` keys and MultiheadAttention modules
        model.requires_grad_(True)
        model.out_dim = self.backbone.embed_dim
        return model

    def head_width(self) -> int:
        """The width of each attention head of the run's image tower."""
        model: Any = self.backbone.model  # an open_clip CLIP
        return int(model.visual.transformer.resblocks[0].attn.head_dim)

    def save_state(self, workdir: Path) -> None:
        """The model's state dict in each of ``CLIP_STATE_FILES`` under ``workdir`` (one file,
        linked), where C3Box's PTM networks read their CLIP's weights."""
        first, *others = (workdir / name for name in CLIP_STATE_FILES)
        torch.save(self.model().state_dict(), first)
        for path in others:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.link(first, path)

    def preprocess(self):
        size, mean, std = self.backbone.image_size, self.backbone.mean, self.backbone.std
        return open_clip.image_transform(size, is_train=False, mean=mean, std=std)

    def triple(self) -> tuple[nn.Module, Any, Any]:
        return self.model(), self.preprocess(), self.backbone.tokenizer

    def create_model_and_transforms(self, *args: Any, **kwargs: Any) -> tuple[nn.Module, Any, Any]:
        """open_clip's ``create_model_and_transforms``, whatever it names: the run's model."""
        preprocess = self.preprocess()
        return self.model(), preprocess, preprocess

    def get_tokenizer(self, *args: Any, **kwargs: Any):
        return self.backbone.tokenizer


@contextlib.contextmanager
def _class_attributes(cls: type, values: dict[str, Any]) -> Iterator[None]:
    """``cls``'s attributes ``values`` for the block; an inherited one is inherited again after."""
    own = {name: cls.__dict__[name] for name in values if name in cls.__dict__}
    for name, value in values.items():
        setattr(cls, name, value)
    try:
        yield
    finally:
        for name in values:
            if name in own:
                setattr(cls, name, own[name])
            else:
                delattr(cls, name)


WORKDIR_PREFIX = "c3box-run-"


class C3BoxShape:
    """What a learner in C3Box's shape gets from the adapter ``adapter`` (see the module)."""

    def __init__(self, adapter: Any) -> None:
        self.adapter = adapter
        self.clip = RunCLIP(adapter.backbone)
        self.device = torch.device(adapter.device)
        self.said_cuda = False
        self.said_heads = False
        # its own working directory: files it writes stay there; the checkout's utils/ is reachable.
        # Named after this process, so that the next run removes it if this one is killed.
        self.workdir = owned_temp_dir(WORKDIR_PREFIX)
        weakref.finalize(self, shutil.rmtree, str(self.workdir), True)
        utils = adapter.root / "utils"
        if utils.is_dir():
            (self.workdir / "utils").symlink_to(utils, target_is_directory=True)
        self.clip.save_state(self.workdir)
        self.state_files = {os.path.realpath(self.workdir / name) for name in CLIP_STATE_FILES}
        self._dress(adapter.data_manager)

    # --- the learner's code running ---

    def patches(self) -> list[tuple[Any, dict[str, Any]]]:
        """open_clip's builders answer with the run's model while the learner's code runs, and its
        reading of ``CLIP_STATE_FILES`` is watched (``_watched_load``)."""
        return [
            (
                open_clip,
                {
                    "create_model_and_transforms": self.clip.create_model_and_transforms,
                    "get_tokenizer": self.clip.get_tokenizer,
                },
            ),
            (torch, {"load": self._watched_load}),
        ]

    def _watched_load(self, f: Any, *args: Any, **kwargs: Any) -> Any:
        """``torch.load``; reading the run's CLIP state file, a network rebuilds the image tower with
        C3Box's head width, which it says once where the run's CLIP has another."""
        if (
            isinstance(f, (str, os.PathLike))
            and not self.said_heads
            and os.path.realpath(f) in self.state_files
        ):
            width = self.clip.head_width()
            if width != C3BOX_HEAD_WIDTH:
                self.said_heads = True
                self.adapter._say(
                    f"{self.adapter.name}: its network rebuilds the image tower from {os.fspath(f)} "
                    f"with {C3BOX_HEAD_WIDTH}-wide attention heads (C3Box's utils/inc_net.py: heads = "
                    f"width // {C3BOX_HEAD_WIDTH}); the run's CLIP has {width}-wide heads, so that "
                    f"tower is not the run's CLIP (a CLIP of {C3BOX_HEAD_WIDTH}-wide heads, such as "
                    "ViT-B/16, is)"
                )
        return TORCH_LOAD(f, *args, **kwargs)

    @contextlib.contextmanager
    def running(self, upstream: contextlib.AbstractContextManager) -> Iterator[None]:
        """``upstream`` (the adapter's running of its code), in its working directory, with its
        ``.cuda()`` on the run's device where that is no GPU."""
        with contextlib.ExitStack() as stack:
            # the working directory first, so that an error's one line can read the files it names
            stack.enter_context(contextlib.chdir(self.workdir))
            stack.enter_context(upstream)
            if self.device.type != "cuda":
                device = self.device

                def tensor_cuda(tensor, *args, **kwargs):
                    return tensor.to(device)

                def module_cuda(module, *args, **kwargs):
                    return module.to(device)

                stack.enter_context(_class_attributes(torch.Tensor, {"cuda": tensor_cuda}))
                stack.enter_context(_class_attributes(nn.Module, {"cuda": module_cuda}))
            yield

    def say_once(self) -> None:
        if self.device.type != "cuda" and not self.said_cuda:
            self.said_cuda = True
            self.adapter._say(
                f"{self.adapter.name}: C3Box's shape (its get_convnet builds a whole CLIP): each of its "
                "networks gets a trainable copy of the run's CLIP (its weights also in ./c.pth, where "
                f"C3Box's PTM networks read them), its .cuda() calls run on {self.device}, and it runs "
                f"in a working directory of its own ({self.workdir})"
            )

    # --- its DataManager ---

    def _dress(self, manager: Any) -> None:
        """The names C3Box's learners read from their DataManager, from the run."""
        manager._class_to_label = manager.class_names  # by position; grows in place
        manager._data_to_prompt = [self.adapter.cfg.prompt_template]
        manager._name = manager.all_class_names  # by the dataset's class id, as C3Box's _name
        manager.concept_order = manager.class_order  # position -> the dataset's class id
        manager.dataset_name = str(self.adapter.args.get("dataset", ""))
        manager.get_attributes = self._get_attributes
        manager.get_prefix = self._get_prefix

    def _upstream_manager(self):
        module = sys.modules.get("utils.data_manager")
        manager = getattr(module, "DataManager", None)
        if manager is None:
            raise UserError(
                f"{self.adapter.name}: C3Box's utils/data_manager.py is not imported, so its concept "
                "lists (get_attributes) cannot be read"
            )
        return manager

    def _get_attributes(self, attribute: str, indice):
        """C3Box's own ``get_attributes`` (its concept lists, by the dataset's class ids)."""
        try:
            return self._upstream_manager().get_attributes(self.adapter.data_manager, attribute, indice)
        except (NotImplementedError, FileNotFoundError) as err:
            missing = getattr(err, "filename", None)
            raise UserError(
                f"{self.adapter.name}: C3Box has no concept list for dataset {attribute!r}"
                + (f" ({missing} is missing from the checkout)" if missing else "")
                + "; its get_attributes (utils/data_manager.py) knows cifar224, cub200, food101, ucf101, "
                "cars, imagenetr, aircraft, sun and objectnet"
            ) from err

    def _get_prefix(self, attribute: Any) -> str:
        try:
            return self._upstream_manager().get_prefix(self.adapter.data_manager, attribute)
        except NotImplementedError as err:
            raise UserError(
                f"{self.adapter.name}: C3Box has no concept prefix for dataset "
                f"{self.adapter.data_manager.dataset_name!r} (get_prefix, utils/data_manager.py)"
            ) from err

    # --- a task begins ---

    def task_sizes(self, args: dict[str, Any], sizes: list[int]) -> None:
        """``init_cls`` and ``increment`` in ``args`` (the learner's own dict) from the stream's task
        sizes; a suite that set them otherwise is refused."""
        found = {"init_cls": sizes[0], "increment": sizes[1] if len(sizes) > 1 else sizes[0]}
        for key, value in found.items():
            given = self.adapter.cfg.args.get(key)
            if given is not None and given != value:
                raise UserError(
                    f"{self.adapter.name}: args {key} = {given}, but the run's tasks have "
                    f"{', '.join(map(str, sizes))} classes; leave {key} out (the stream gives it)"
                )
            args[key] = value

    # --- scores ---

    def scores(self, images: torch.Tensor) -> torch.Tensor:
        """The logits the learner's own ``_eval_cnn`` ranks for ``images`` (one batch)."""
        learner = self.adapter.learner
        ranked: list[torch.Tensor] = []
        topk = torch.topk

        def watched(input, *args, **kwargs):
            ranked.append(input.detach())
            return topk(input, *args, **kwargs)

        batch = (
            torch.arange(len(images)),
            images.to(self.device),
            torch.zeros(len(images), dtype=torch.long),
        )
        with mock.patch.object(torch, "topk", watched):
            learner._eval_cnn([batch])
        if not ranked:
            raise UserError(
                f"{self.adapter.name}: its _eval_cnn ranked nothing with torch.topk, so the suite has no "
                "scores of it"
            )
        return ranked[-1]
