"""Building a CLIP: model names to configs, configs and weight files to open_clip models (never a
download), and ``create_clip``, the one entry point that returns a ``CLIPBackbone``."""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import logging
import os
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import open_clip
import torch
from huggingface_hub import constants as hf_constants
from huggingface_hub import try_to_load_from_cache
from open_clip.constants import HF_SAFE_WEIGHTS_NAME
from open_clip.transformer import VisionTransformer

from benchmarks.backbone.attention import split_attention_
from benchmarks.backbone.clip import CLIPBackbone
from benchmarks.backbone.tags import check_tag, hub_files, manual_file
from benchmarks.core.errors import UserError, WeightsNotFoundError

DEFAULT_MODEL = "ViT-B-16-quickgelu"
TINY_MODEL = "tiny-clip-32"

_MODEL_CONFIG_DIR = Path(__file__).parent.parent / "model_configs"
# pretrained="synthetic" for the tiny model: the shipped checkpoint of
# `python -m benchmarks.miniature.pretrain`.
SYNTHETIC_TAG = "synthetic"
SYNTHETIC_WEIGHTS = Path(__file__).parent.parent / "assets" / "tiny-clip-32-synthetic.safetensors"
# Extra entries in the state dict of the original OpenAI TorchScript checkpoints.
_OPENAI_EXTRA_KEYS = ("input_resolution", "context_length", "vocab_size")
_WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".ckpt")


def _register_model_configs() -> None:
    """Make the configs shipped in ``model_configs/`` (the tiny model) known to open_clip."""
    if TINY_MODEL not in open_clip.list_models():
        open_clip.add_model_config(_MODEL_CONFIG_DIR)


_register_model_configs()


@dataclass(frozen=True)
class BackboneSpec:
    """Which CLIP to build and where its weights come from."""

    model: str = DEFAULT_MODEL
    pretrained: str | None = "openai"  # open_clip tag, path to a weight file, or None (random init)
    cache_dir: str | None = None  # open_clip / Hugging Face cache to look in (default: theirs)


def _check_model_config(name: str) -> None:
    """Fail early (before any network-capable open_clip code runs) on names we cannot build offline."""
    if ":" in name:
        raise UserError(
            f"model {name!r}: hf-hub:/local-dir: names are not supported; "
            "use a built-in open_clip name and give the weights as a file"
        )
    cfg = open_clip.get_model_config(name)
    if cfg is None:
        close = difflib.get_close_matches(name, open_clip.list_models(), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise UserError(
            f"unknown model {name!r}{hint}; list valid names with: "
            "python -c 'import open_clip; print(open_clip.list_models())'"
        )
    text_cfg, vision_cfg = cfg.get("text_cfg", {}), cfg.get("vision_cfg", {})
    # HF text towers, HF tokenizers and timm image towers would fetch files from the hub.
    if (
        cfg.get("custom_text")
        or "multimodal_cfg" in cfg
        or "hf_model_name" in text_cfg
        or "hf_tokenizer_name" in text_cfg
        or "timm_model_name" in vision_cfg
    ):
        raise UserError(
            f"model {name!r} is not supported: only open_clip CLIP ViT models with the built-in text tower"
        )


def _cached_checkpoint(cfg: dict[str, Any], cache_dir: str | None) -> tuple[Path | None, list[str]]:
    """Find the file of a pretrained tag in the local caches; return it (or None) and the places looked at."""
    looked: list[str] = []
    if cfg.get("file"):
        if Path(cfg["file"]).is_file():
            return Path(cfg["file"]), looked
        looked.append(str(cfg["file"]))
    if cfg.get("hf_hub"):
        repo_id, names = hub_files(cfg)  # open_clip prefers a safetensors twin of the listed file; either
        for name in names:
            hit = try_to_load_from_cache(repo_id, name, cache_dir=cache_dir)
            if isinstance(hit, str):
                return Path(hit), looked
        looked.append(f"HF cache {cache_dir or hf_constants.HF_HUB_CACHE} ({repo_id}: {' or '.join(names)})")
        if not cfg.get("url"):  # a hub-only file downloaded by hand (tags.manual_file), either name
            folder = manual_file(cfg, cache_dir).parent
            for name in names:
                if (folder / name).is_file():
                    return folder / name, looked
            looked.append(str(folder / names[0]))
    if cfg.get("url"):
        target = manual_file(cfg, cache_dir)
        if target.is_file():
            return target, looked
        looked.append(str(target))
    return None, looked


def _resolve_weights(spec: BackboneSpec) -> tuple[Path | None, dict[str, Any]]:
    """Return the checkpoint file to load (None = random init) and the tag's preprocessing config."""
    if spec.pretrained is None:
        return None, {}
    path = Path(spec.pretrained).expanduser()
    if path.is_file():
        return path, {}
    if spec.model == TINY_MODEL and spec.pretrained == SYNTHETIC_TAG:
        if not SYNTHETIC_WEIGHTS.is_file():
            raise WeightsNotFoundError(
                f"{SYNTHETIC_WEIGHTS} is missing; recreate it with: python -m benchmarks.miniature.pretrain"
            )
        return SYNTHETIC_WEIGHTS, {}
    cfg = check_tag(spec.model, spec.pretrained)  # a listed tag, trained with the model's activation
    found, looked = _cached_checkpoint(cfg, spec.cache_dir)
    if found is None:
        example = os.path.basename(cfg.get("url", "")) or HF_SAFE_WEIGHTS_NAME
        raise WeightsNotFoundError(
            f"weights {spec.model}/{spec.pretrained} not found locally (looked in: {'; '.join(looked)}); "
            f"runs never download: fetch them once with python -m benchmarks.prepare "
            f"{weights_target_name(spec.model, spec.pretrained)}, or pass --weights /path/to/{example}"
        )
    return found, cfg


def weights_target_name(model: str, tag: str) -> str:
    """The ``prepare`` target of a model's open_clip weights: ``weights`` for the default ones,
    ``weights:MODEL/TAG`` for any other."""
    return "weights" if (model, tag) == (DEFAULT_MODEL, "openai") else f"weights:{model}/{tag}"


@contextlib.contextmanager
def quiet_root_logger():
    """Within the block, the root logger shows errors only (open_clip warns about a deliberate
    random init through it)."""
    logger = logging.getLogger()
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def check_names(model: str, pretrained: str | None) -> None:
    """Fail in one line on a model name, or an open_clip tag for it, that open_clip's registry does not
    list (or lists for the other activation), without looking for any file: a suite's check. A path
    (it has a folder or a weight file's suffix), "none" and the tiny model's synthetic tag are not tags."""
    _check_model_config(model)
    path_like = pretrained is not None and ("/" in pretrained or pretrained.endswith(_WEIGHT_SUFFIXES))
    if pretrained is None or path_like or pretrained.lower() == "none" or Path(pretrained).is_file():
        return
    if (model, pretrained) != (TINY_MODEL, SYNTHETIC_TAG):
        check_tag(model, pretrained)


def check_weights(spec: BackboneSpec) -> Path | None:
    """Fail fast with a one-line error if the model name or its weights cannot be found offline."""
    _check_model_config(spec.model)
    return _resolve_weights(spec)[0]


def weights_digest(spec: BackboneSpec) -> str | None:
    """SHA-256 (first 16 hex digits) of the shipped synthetic checkpoint; None for any other weights.

    The tag "synthetic" names a file that is re-pretrained whenever the miniature's world changes,
    so its digest joins the hashed run config: results of an older checkpoint are never reused.
    Real weights are fixed by their open_clip tag or by the path a user gives.
    """
    if not (spec.model == TINY_MODEL and spec.pretrained == SYNTHETIC_TAG and SYNTHETIC_WEIGHTS.is_file()):
        return None
    stat = SYNTHETIC_WEIGHTS.stat()
    return _file_digest(str(SYNTHETIC_WEIGHTS), stat.st_size, stat.st_mtime_ns)


def weights_file(spec: BackboneSpec) -> dict[str, str] | None:
    """The weight file a run of ``spec`` loads, as its result records it (name and SHA-256, not
    hashed: the tag or path in ``backbone`` names the weights); None for a random init or weights
    that cannot be found (the run stops on them before it records anything)."""
    try:
        path = _resolve_weights(spec)[0]
    except UserError:
        return None
    if path is None:
        return None
    stat = path.stat()
    return {"file": path.name, "sha256": _file_sha256(str(path), stat.st_size, stat.st_mtime_ns)}


def recorded_backbone(backbone: dict) -> dict:
    """A run config's ``backbone`` entry (``model``, ``pretrained``, ...) as results record it:
    with ``weights_sha256`` where the weights are the shipped synthetic checkpoint."""
    digest = weights_digest(BackboneSpec(backbone["model"], backbone["pretrained"]))
    return {**backbone, "weights_sha256": digest} if digest else dict(backbone)


def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    return _file_sha256(path, size, mtime_ns)[:16]


@functools.lru_cache(maxsize=8)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:  # size and mtime key the cache
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _is_torchscript_archive(path: Path) -> bool:
    # The original OpenAI checkpoints (~/.cache/clip/ViT-B-16.pt) are TorchScript archives, which
    # torch.load(weights_only=True) refuses; like torch, recognise them by their constants.pkl record.
    if path.suffix == ".safetensors" or not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(name.split("/")[-1] == "constants.pkl" for name in archive.namelist())


def _build_model(spec: BackboneSpec, device: torch.device) -> open_clip.CLIP:
    checkpoint, pretrained_cfg = _resolve_weights(spec)
    # open_clip loads plain files itself (weights_only=True); TorchScript archives are loaded below.
    scripted = checkpoint is not None and _is_torchscript_archive(checkpoint)
    file_for_open_clip = str(checkpoint) if checkpoint is not None and not scripted else None
    try:
        # open_clip logs a warning for a deliberate random init (pretrained=None); we asked for it
        quiet = quiet_root_logger() if checkpoint is None else contextlib.nullcontext()
        with quiet:
            model = open_clip.create_model(
                spec.model,
                pretrained=file_for_open_clip,
                device=device,
                # open_clip keeps only the preprocessing keys (mean, std, ...)
                force_preprocess_cfg=pretrained_cfg,
                pretrained_text=False,
                weights_only=True,
            )
        if scripted:
            with warnings.catch_warnings():  # torch deprecates TorchScript, but OpenAI's files are in it
                warnings.simplefilter("ignore", FutureWarning)
                state = torch.jit.load(str(checkpoint), map_location="cpu").state_dict()
            # Scripted state dicts also hold non-persistent buffers (the causal mask) and, for OpenAI's
            # files, a few hyper-parameters; everything else must match exactly.
            persistent = model.state_dict().keys()
            ignored = {name for name, _ in model.named_buffers()} - persistent
            model.load_state_dict(
                {k: v for k, v in state.items() if k not in ignored and k not in _OPENAI_EXTRA_KEYS}
            )
    except Exception as err:  # anything that goes wrong while reading a user's file is the file's fault
        if checkpoint is None:
            raise
        reason = " ".join(str(err).split())[:300] or type(err).__name__  # one line for the CLI
        raise UserError(f"cannot load {spec.model} weights from {checkpoint}: {reason}") from err
    if not isinstance(model, open_clip.CLIP) or not isinstance(model.visual, VisionTransformer):
        raise UserError(f"model {spec.model!r} is not supported: only open_clip CLIP ViT models")
    if model.text_pool_type != "argmax" or model.attn_mask is None:
        raise UserError(
            f"model {spec.model!r} is not supported: the text tower must be causal with EOT pooling"
        )
    return model


def create_clip(spec: BackboneSpec, device: str | torch.device = "cpu") -> CLIPBackbone:
    """Build the CLIP of ``spec`` on ``device``, attention split, base weights frozen, no adapters."""
    _check_model_config(spec.model)
    model = _build_model(spec, torch.device(device))
    split_attention_(model)
    return CLIPBackbone(model, open_clip.get_tokenizer(spec.model))
