"""Building a CLIP: a ``BackboneSpec``'s weights (found by ``weights``, never downloaded) into an
open_clip model, and ``create_clip``, the one entry point that returns a ``CLIPBackbone``."""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
import zipfile
from pathlib import Path

import open_clip
import torch
from open_clip.transformer import VisionTransformer

from benchmarks.backbone.attention import split_attention_
from benchmarks.backbone.clip import CLIPBackbone
from benchmarks.backbone.registry import live_open_clip
from benchmarks.backbone.weights import (
    DEFAULT_MODEL,
    SYNTHETIC_CHECKPOINTS,
    SYNTHETIC_TAG,
    SYNTHETIC_WEIGHTS,
    TINY_MODEL,
    BackboneSpec,
    check_model_config,
    check_names,
    check_weights,
    recorded_backbone,
    resolve_weights,
    weights_digest,
    weights_file,
    weights_target_name,
)
from benchmarks.core.errors import UserError

__all__ = [  # the names of ``weights`` are the loader's too
    "DEFAULT_MODEL",
    "SYNTHETIC_CHECKPOINTS",
    "SYNTHETIC_TAG",
    "SYNTHETIC_WEIGHTS",
    "TINY_MODEL",
    "BackboneSpec",
    "check_names",
    "check_weights",
    "create_clip",
    "quiet_root_logger",
    "recorded_backbone",
    "weights_digest",
    "weights_file",
    "weights_target_name",
]

# Extra entries in the state dict of the original OpenAI TorchScript checkpoints.
_OPENAI_EXTRA_KEYS = ("input_resolution", "context_length", "vocab_size")


live_open_clip()  # the configs shipped in ``model_configs/`` (the tiny model) known to open_clip


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


def _is_torchscript_archive(path: Path) -> bool:
    # The original OpenAI checkpoints (~/.cache/clip/ViT-B-16.pt) are TorchScript archives, which
    # torch.load(weights_only=True) refuses; like torch, recognise them by their constants.pkl record.
    if path.suffix == ".safetensors" or not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(name.split("/")[-1] == "constants.pkl" for name in archive.namelist())


def _build_model(spec: BackboneSpec, device: torch.device) -> open_clip.CLIP:
    checkpoint, pretrained_cfg = resolve_weights(spec)
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
    check_model_config(spec.model)
    model = _build_model(spec, torch.device(device))
    split_attention_(model)
    return CLIPBackbone(model, clip_tokenizer(spec.model))


@functools.lru_cache(maxsize=8)
def clip_tokenizer(model: str):
    """open_clip's tokenizer of ``model``, built once per process and shared by every backbone of
    that model: it holds no state a run changes, and building it (reading CLIP's 48,894 BPE merges)
    took 0.08 s of every build."""
    return open_clip.get_tokenizer(model)
