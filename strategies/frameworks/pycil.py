"""Learners of the LAMDA family (PyCIL, PILOT, C3Box) under the suite's protocol, unchanged.

Such a learner is built as ``cls(args)`` from a dict of options and keeps its model in
``learner._network`` (a module whose output holds ``"logits"``, one column per class position). For
each task the runner's experience becomes a ``DataManager`` with the family's conventions, then
``incremental_train(data_manager)`` and ``after_task()`` run. Class ids are positions in the order
the classes were learned: position ``k`` is ``seen_classes[k]``.

``args`` is the suite's ``args`` table (any key the learner reads: ``memory_size``,
``convnet_type``, ``init_epoch``, ...), then the run's facts: ``device`` (a one-element list, the
family's multi-GPU convention), ``seed``, ``backbone`` (the run's ``CLIPBackbone``),
``class_names`` (by position; the list grows in place). A
``convnet_type`` (PyCIL) or ``backbone_type`` (PILOT) of ``"clip"``, the default, makes the
family's own network factory (``get_convnet``/``get_backbone``) return the run's frozen CLIP image
tower, so the learner's network is the family's, on the suite's backbone.

The learner's files are never edited (``strategies.frameworks.upstream``): its module's epoch
constants follow the suite's ``epoch_scale`` for each call, its progress bars and logging follow
``--quiet``, an exception inside its files is one line naming the file and line, and in a fast dev
run every epoch of its training loaders (``DataLoader`` over ``get_dataset(mode="train")``) ends after
the run's ``train_batches`` (``benchmarks.data.loaders.FirstBatches``).
"""

from __future__ import annotations

import copy
import difflib
import re
import sys
import warnings
from types import FunctionType
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from benchmarks.backbone import CLIPBackbone
from benchmarks.core.errors import UserError
from benchmarks.data.loaders import FirstBatches
from strategies.checkpointing import pack_state, unpack_state
from strategies.frameworks.common import FrameworkAdapter, refuse_plugins, task_classes
from strategies.frameworks.pycil_clip import C3BoxShape, RunCLIP, builds_whole_clip, whole_clip_factories
from strategies.frameworks.pycil_config import PyCILConfig, ReadArgs
from strategies.frameworks.pycil_data import VALIDATION_PER_CLASS, DataManager, ItemImages
from strategies.frameworks.pycil_state import (
    changed_outside,
    class_name,
    fingerprint,
    load_exactly,
    module_mode,
    modules_outside_state_dict,
    on_accelerator,
    packed_under,
    plain_tensors,
    set_mode,
    state_shapes,
    tensors_as_built,
    to_device,
)
from strategies.frameworks.upstream import (
    modules_under,
    root_of,
    running_upstream,
    scaled_epochs,
)

CLIP = "clip"


def loader_workers(constants: dict[str, Any], workers: int) -> dict[str, tuple[Any, int]]:
    """The loader-worker constants among a module's ``constants`` (PyCIL's ``num_workers = 8``) that
    differ from the run's ``workers``: name -> (as written, as run). Eight loader processes an epoch
    on a two-core machine only compete with the training."""
    return {
        name: (value, workers)
        for name, value in constants.items()
        if re.search(r"(?:^|_)num_workers$", name)
        and isinstance(value, int)
        and not isinstance(value, bool)
        and value != workers
    }


class CLIPImageTower(nn.Module):
    """The run's CLIP image tower in the shape of the family's convnets: ``out_dim`` and a dict
    with the unnormalised image embeddings as ``features`` (no feature maps)."""

    def __init__(self, backbone: CLIPBackbone) -> None:
        super().__init__()
        self.backbone = backbone
        self.out_dim = backbone.embed_dim

    def forward(self, images: torch.Tensor) -> dict[str, Any]:
        return {"fmaps": [], "features": self.backbone.encode_image(images, normalize=False)}


class PyCILAdapter(FrameworkAdapter[PyCILConfig]):
    """A LAMDA-family learner (``wrapped``) run on the stream; see the module's docstring."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.data_manager = DataManager(len(self.class_names), self.class_names, self.name, self._say)
        self.root = root_of(self.wrapped.__module__)
        self.upstream_modules = modules_under(self.root)
        module = sys.modules[self.wrapped.__module__]
        constants = {k: v for k, v in vars(module).items() if not k.startswith("_")}
        self.scaled_constants = {
            f"{module.__name__}.{k}": change
            for k, change in scaled_epochs(constants, self.cfg.epoch_scale, self.cfg.epoch_cap).items()
        }
        workers = loader_workers(constants, self.cfg.num_workers)
        self.worker_constants = {f"{module.__name__}.{k}": change for k, change in workers.items()}
        as_run = {**self.scaled_constants, **self.worker_constants}
        constants_as_run = {k.rpartition(".")[2]: new for k, (_, new) in as_run.items()}
        # found once: scoring enters the learner's code once a batch
        self._patches = [(module, constants_as_run), *self._factories(), *self._capped_loaders()]
        self.args = ReadArgs(  # the keys the learner looks up, for _say_unread_args
            {
                "convnet_type": CLIP,
                "backbone_type": CLIP,
                **self.cfg.args,
                "device": [self.device],
                "seed": self.settings.seed,
                "backbone": self.backbone,
                "class_names": self.data_manager.class_names,
            }
        )
        self._args_named: set[str] = set()  # the suite's args keys a warning has named unread
        refuse_plugins(self.name, self.plugins)  # they could never see the learner's loop
        # C3Box's shape: a factory that builds a whole CLIP (strategies.frameworks.pycil_clip)
        self.c3box = C3BoxShape(self) if whole_clip_factories(self.upstream_modules) else None
        if self.c3box is not None:
            self._patches += self.c3box.patches()
            self.c3box.say_once()
        if self.scaled_constants:
            self._say(
                f"{self.name}: epoch constants of its module as run: "
                + ", ".join(f"{k} {old} -> {new}" for k, (old, new) in self.scaled_constants.items())
            )
        if self.worker_constants:
            self._say(
                f"{self.name}: loader workers of its module as run (the run's num_workers): "
                + ", ".join(f"{k} {old} -> {new}" for k, (old, new) in self.worker_constants.items())
            )
        # the backbone's pretrained tensors as built: a checkpoint leaves out those still untouched
        self._pristine = {id(t): (t, t._version) for t in self.backbone.state_dict(keep_vars=True).values()}
        with self._upstream("building the learner"):
            self.learner = self.wrapped(self.args)
        # modules its network keeps outside its state dict, as built: one trained later, or made
        # later, is state a checkpoint cannot hold (checkpoint_state)
        self._outside_built = tensors_as_built(modules_outside_state_dict(self.network))
        # ...or a fresh copy of the run's CLIP, as its factory gives one (a network rebuilt in a task)
        self._pristine_outside = (
            frozenset() if self.c3box is None else frozenset({fingerprint(self.c3box.clip.model())})
        )

    def _say(self, line: str) -> None:
        # a warning: the commands print it as one line, and --quiet drops it with the rest
        warnings.warn(line, stacklevel=2)

    @property
    def network(self) -> nn.Module:
        return self.learner._network

    def _upstream(self, doing: str):
        """The learner's code running: the suite's patches on its modules, errors in one line."""
        quiet = None if self.settings.show_progress else self.upstream_modules
        running = running_upstream(self.root, self.name, doing, self._passed, self._patches, quiet)
        return running if self.c3box is None else self.c3box.running(running)

    def _passed(self) -> str:
        shown = {k: v for k, v in self.args.items() if k not in ("backbone", "class_names")}
        return f"args {shown}"

    def _factories(self) -> list[tuple[Any, dict[str, Any]]]:
        """The family's network factories, each answering ``"clip"`` with the run's image tower."""
        originals = {}
        for module in self.upstream_modules:
            for factory, key in (("get_convnet", "convnet_type"), ("get_backbone", "backbone_type")):
                fn = vars(module).get(factory)
                if isinstance(fn, FunctionType) and fn.__module__ == module.__name__:
                    originals[fn] = key
        patches = []
        for module in self.upstream_modules:
            values = {}
            for name, value in vars(module).items():
                if isinstance(value, FunctionType) and value in originals:
                    values[name] = _clip_or(value, originals[value])
            if values:
                patches.append((module, values))
        return patches

    def _capped_loaders(self) -> list[tuple[Any, dict[str, Any]]]:
        """A fast dev run: in each of the learner's modules, ``DataLoader`` answers a training set
        (``get_dataset(mode="train")``) with a loader whose every epoch ends after ``train_batches``
        batches (``FirstBatches``); its other loaders (exemplars, class means, its own test) are whole."""
        train_batches = self.settings.train_batches
        if train_batches is None:
            return []

        def loader(dataset, *args, **kwargs):
            built = DataLoader(dataset, *args, **kwargs)
            training = isinstance(dataset, ItemImages) and dataset.trsf == "train"
            return FirstBatches(built, train_batches) if training else built

        modules = [m for m in self.upstream_modules if vars(m).get("DataLoader") is DataLoader]
        return [(module, {"DataLoader": loader}) for module in modules]

    def learn(self, experience) -> None:
        classes = task_classes(experience, len(self.class_names), self.seen_classes, self.name)
        self.data_manager.begin_task(experience, classes)
        if self.c3box is not None:
            sizes = self.data_manager.stream_sizes or self.data_manager.task_sizes
            self.c3box.task_sizes(self.args, sizes)
        counter = self.network.register_forward_hook(_step_counter(self))
        try:
            with self._upstream(f"learning task {len(self.data_manager.task_sizes)}"):
                self.learner.incremental_train(self.data_manager)
                self.learner.after_task()
        finally:
            counter.remove()
        self.seen_classes = self.seen_classes + classes
        self._say_unread_args()

    def _say_unread_args(self) -> None:
        """One warning line naming the suite's ``args`` keys the learner has not read: after a task,
        those close to a key it looked up (a misspelling, found early); after the last task, every
        one still unread. Each key is named once."""
        manager = self.data_manager
        last = len(self.seen_classes) == len(self.class_names) or (
            manager.stream_sizes is not None and len(manager.task_sizes) == manager.nb_tasks
        )
        looked_up = sorted(str(k) for k in self.args.looked_up)
        named = []
        for key in self.cfg.args:
            if key in self.args.looked_up or key in self._args_named:
                continue
            close = difflib.get_close_matches(key, looked_up, n=1)
            if close or last:
                named.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
                self._args_named.add(key)
        if named:
            when = "in the whole run" if last else f"in task {len(manager.task_sizes)}"
            self._say(
                f"{self.name}: the learner never read args {', '.join(named)} {when}, so they changed "
                "nothing; check their spelling against the learner's code"
            )

    @torch.no_grad()
    def scores(self, images: torch.Tensor) -> torch.Tensor:
        with self._upstream("scoring the test set"):
            if self.c3box is not None:  # its prediction is its own _eval_cnn: the logits it ranks
                logits = self.c3box.scores(images)
            else:
                self.network.eval()
                logits = self.network(images.to(self.device))["logits"]
        n_seen = len(self.seen_classes)
        if logits.shape[1] < n_seen:
            raise UserError(
                f"{self.name}: the network gives {logits.shape[1]} logits for {n_seen} seen classes; "
                "grow it in incremental_train (update_fc)"
            )
        return logits[:, :n_seen].float()

    def run_diagnostics(self) -> dict[str, Any]:
        """What the suite changed in the learner's module, and what its own test loader got."""
        return {
            "epoch_constants": {k: list(v) for k, v in self.scaled_constants.items()},
            "own_test_loader": f"{VALIDATION_PER_CLASS} training images a class, eval transform",
        }

    # --- checkpoints: the network, then every attribute of the learner that holds state ---

    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors, meta = super().checkpoint_state()
        untouched = []
        for key, value in self.network.state_dict(keep_vars=True).items():
            if self._is_pristine(value):
                untouched.append(key)
            else:
                tensors[f"network/{key}"] = value.detach().cpu().contiguous()
        saved: dict[str, dict[str, Any]] = {}
        unsaved: list[str] = []
        known = self._network_objects()
        for attr, value in vars(self.learner).items():
            if attr != "_network" and (alias := known.get(id(value))) is not None:
                saved[attr] = {"as": "alias", "of": alias}
                continue
            kind = self._learner_kind(attr, value)
            if kind is None:
                continue
            if kind == "unsaved":
                unsaved.append(attr)
                continue
            if isinstance(value, np.generic):  # a numpy scalar: kept as its Python number
                value = value.item()
            if kind == "numpy":
                value = torch.from_numpy(np.ascontiguousarray(value))
            if kind == "numpy_list":
                value = [torch.from_numpy(np.ascontiguousarray(v)) for v in value]
            meta_kind: Any  # JSON: pack_state's kind, or a module's class, trainable names and mode
            if kind == "copy":
                packed = self._copy_state(value)
                meta_kind = module_mode(value)
            elif kind == "module":  # a module of its own (RAPF's adapter): its whole state
                packed = pack_state(value)[1]
                meta_kind = {**module_mode(value), "class": class_name(value)}
            else:
                meta_kind, packed = pack_state(value)
            saved[attr] = {"as": kind, "kind": meta_kind}
            if kind == "value" and on_accelerator(value):  # packed on the CPU: put back on the device
                saved[attr]["on_device"] = True
            if isinstance(vars(self.learner)[attr], (nn.Module, torch.Tensor)):  # a later one may alias it
                known[id(vars(self.learner)[attr])] = attr
            tensors.update({f"learner/{attr}{suffix}": t for suffix, t in packed.items()})
        unsaved += changed_outside(
            self.network, self._outside_built, self._pristine_outside
        )  # in no state dict: starts over
        meta["learner"] = {
            "total_classes": self.learner._total_classes,
            "attributes": saved,
            "unsaved": unsaved,
            # a resumed run knows what the tasks before it read (a key read in task 1 alone)
            "args_looked_up": sorted(str(k) for k in self.args.looked_up),
            "args_named_unread": sorted(self._args_named),
        }
        meta["network_untouched"] = untouched
        meta["network_shapes"] = state_shapes(self.network)
        meta["network_tensors"] = plain_tensors(self.network)
        manager = self.data_manager
        meta["data_manager"] = {"task_sizes": manager.task_sizes, "nb_tasks": manager.nb_tasks}
        return tensors, meta

    def _network_objects(self) -> dict[int, str]:
        """The network and its tensors by id, each with its name for an alias: ``"_network"``,
        ``"_network/<state_dict key>"``. An attribute that is one of them (PyCIL's
        ``_network_module_ptr``) is saved as an alias, restored as the same object."""
        known = {id(self.network): "_network"}
        for key, tensor in self.network.state_dict(keep_vars=True).items():
            known.setdefault(id(tensor), f"_network/{key}")
        return known

    def _aliased(self, name: str) -> Any:
        """The object an alias saved by ``checkpoint_state`` names, in the restored learner."""
        owner, _, key = name.partition("/")
        if owner != "_network":
            return getattr(self.learner, owner)
        return self.network.state_dict(keep_vars=True)[key] if key else self.network

    def _learner_kind(self, attr: str, value: Any) -> str | None:
        """How a learner attribute is saved: None (the run's, or rebuilt each task), "numpy",
        "numpy_list", "copy" (a module that is a copy of the network: its changed tensors), "module"
        (another module: its whole state), "value" or "unsaved"."""
        if attr in ("args", "_network") or value is self.data_manager:
            return None
        if isinstance(value, (DataLoader, Dataset, torch.device)) or _is_devices(value):
            return None
        if isinstance(value, np.ndarray):
            return "unsaved" if value.dtype == object else "numpy"
        if isinstance(value, np.generic):
            return "value"
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, np.ndarray) for v in value):
            return "unsaved" if any(v.dtype == object for v in value) else "numpy_list"
        if isinstance(value, nn.Module):
            return "copy" if type(value) is type(self.network) else "module"
        if callable(value):
            return None
        try:
            pack_state(value)
        except (TypeError, ValueError):
            return "unsaved"
        return "value"

    def _copy_state(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """A copy of the network's tensors, less those equal to the network's untouched ones."""
        network = self.network.state_dict(keep_vars=True)
        packed = {}
        for key, value in module.state_dict().items():
            mine = network.get(key)
            if (
                mine is not None
                and self._is_pristine(mine)
                and mine.shape == value.shape
                and torch.equal(mine, value)
            ):
                continue
            packed[f"/{key}"] = value.detach().cpu().contiguous()
        return packed

    def _is_pristine(self, tensor: torch.Tensor) -> bool:
        built = self._pristine.get(id(tensor))
        return built is not None and built[0] is tensor and tensor._version == built[1]

    def resume_refusal(self, meta: dict[str, Any]) -> str | None:
        """Why a checkpoint cannot restore this learner (state it could not save), or None."""
        unsaved = meta.get("learner", {}).get("unsaved", [])
        if unsaved:
            return f"the learner's attributes {unsaved} cannot be saved in a checkpoint"
        for attr, how in meta.get("learner", {}).get("attributes", {}).items():
            if how["as"] == "module" and self._module_like(attr, how["kind"]["class"], copy_it=False) is None:
                return (
                    f"the learner's {attr} ({how['kind']['class']}) has no module of its class in a "
                    "fresh learner to be loaded into"
                )
        return self._unrebuilt(meta)

    def _module_like(self, attr: str, of_class: str, copy_it: bool = True) -> Any:
        """The module a saved one of class ``of_class`` loads into: the fresh learner's own ``attr`` (built
        in its ``__init__``), else a copy of another of its modules of that class (RAPF's
        ``old_adapter``, a copy of its ``adapter`` made after a task); None where it has neither."""
        current = getattr(self.learner, attr, None)
        if isinstance(current, nn.Module) and class_name(current) == of_class:
            return current
        for value in vars(self.learner).values():
            if isinstance(value, nn.Module) and class_name(value) == of_class:
                return copy.deepcopy(value) if copy_it else value
        return None

    def _unrebuilt(self, meta: dict[str, Any]) -> str | None:
        """Why this fresh network, as built or grown by its ``update_fc`` to the saved size (all a
        resume can replay), cannot hold the checkpoint's network: modules or tensors the learner
        added another way (C3Box's PROOF: a projection a task by ``extend_task``, prototypes as a
        plain tensor)."""
        if "network_shapes" not in meta:  # written before this check: loading it says whether it fits
            return None
        probe: Any = self.network
        if state_shapes(probe) != meta["network_shapes"] and hasattr(probe, "update_fc"):
            with self._upstream("checking a checkpoint"):
                probe = copy.deepcopy(self.network)  # this network stays as built, for a start over
                probe.update_fc(meta["learner"]["total_classes"])
        shapes, saved = state_shapes(probe), meta["network_shapes"]
        if differ := sorted(key for key in saved.keys() | shapes.keys() if saved.get(key) != shapes.get(key)):
            return f"its network grows what update_fc does not rebuild ({', '.join(differ[:3])})"
        if outside := sorted(set(meta["network_tensors"]) - set(plain_tensors(probe))):
            return f"its network holds tensors outside its state dict ({', '.join(outside[:3])})"
        return None

    def load_checkpoint_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        super().load_checkpoint_state(tensors, meta)
        saved = meta["learner"]
        with self._upstream("restoring a checkpoint"):
            network: Any = self.network  # the learner's own network class, its members untyped here
            grown = state_shapes(network) != meta.get("network_shapes")  # always, for an older checkpoint
            if grown and hasattr(network, "update_fc"):  # a growing network takes the saved size first
                network.update_fc(saved["total_classes"])
            load_exactly(
                self.network, packed_under(tensors, "network/", sep=""), meta["network_untouched"], self.name
            )
            pristine_copy = copy.deepcopy(self.network)  # taken before a later attribute changes it
        for attr, how in saved["attributes"].items():
            packed = packed_under(tensors, f"learner/{attr}")
            value: Any  # whatever the learner held: a module, a tensor, an array, a list, a number
            if how["as"] == "alias":  # saved in order, so what it names is restored already
                value = self._aliased(how["of"])
            elif how["as"] == "copy":
                value = copy.deepcopy(pristine_copy)
                load_exactly(value, {k.lstrip("/"): t for k, t in packed.items()}, None, self.name)
                set_mode(value, how["kind"])
            elif how["as"] == "module":
                value = self._module_like(attr, how["kind"]["class"])
                load_exactly(value, {k.lstrip("/"): t for k, t in packed.items()}, (), self.name)
                set_mode(value, how["kind"])
            else:
                value = unpack_state(how["kind"], packed, getattr(self.learner, attr, None))
                if how.get("on_device"):
                    value = to_device(value, self.device)
                if how["as"] == "numpy":
                    value = value.numpy()
                elif how["as"] == "numpy_list":
                    value = [v.numpy() for v in value]
            setattr(self.learner, attr, value)
        self.data_manager.restore(self.seen_classes, **meta["data_manager"])
        self.args.looked_up.update(saved.get("args_looked_up", []))
        self._args_named.update(saved.get("args_named_unread", []))


def _step_counter(adapter: PyCILAdapter):
    """A forward hook counting the passes that train (train mode, with a graph) as steps. A plain
    function, so a copy of the network (iCaRL's old network) shares it instead of copying the adapter."""

    def count(module: nn.Module, inputs, output) -> None:
        if module.training and torch.is_grad_enabled():
            adapter.train_iterations += 1

    return count


def _clip_or(factory, key: str):
    """``factory(args, ...)``, or the run's CLIP image tower where ``args[key]`` is ``"clip"``."""

    def build(args, *rest, **options):
        if str(args.get(key, "")).lower() == CLIP:
            if builds_whole_clip(factory):  # C3Box's: (model, preprocess, tokenizer), a copy each call
                return RunCLIP(args["backbone"]).triple()
            return CLIPImageTower(args["backbone"])
        return factory(args, *rest, **options)

    return build


def _is_devices(value: Any) -> bool:
    return (
        isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, torch.device) for v in value)
    )


def adapt(cls: type, name: str) -> type:
    """The suite's strategy around the LAMDA-family learner ``cls`` (``pycil:module:Class``)."""
    if not callable(getattr(cls, "incremental_train", None)):
        raise UserError(
            f"{name}: {getattr(cls, '__name__', cls)} has no incremental_train(data_manager); a pycil: "
            "strategy is a learner in PyCIL's shape (docs/adding-a-strategy.md)"
        )
    config = getattr(cls, "Config", None)
    config = config if isinstance(config, type) and issubclass(config, PyCILConfig) else PyCILConfig
    return type(
        cls.__name__,
        (PyCILAdapter,),
        {"wrapped": cls, "name": name, "Config": config, "__module__": __name__},
    )
