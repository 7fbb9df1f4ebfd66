"""Which weights a ``BackboneSpec`` names, and where they are: model names and open_clip tags checked
in one line, weight files found in the local caches (never a download), and what a result records
of them. Neither torch nor open_clip is imported here (``registry`` reads open_clip's registry), so
``prepare`` and a suite's checks answer in a second; ``loading`` builds the model from what this finds.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub import constants as hf_constants
from huggingface_hub import try_to_load_from_cache

from benchmarks.backbone import registry
from benchmarks.backbone.tags import check_tag, hub_files_of, manual_file
from benchmarks.core.errors import UserError, WeightsNotFoundError

DEFAULT_MODEL = "ViT-B-16-quickgelu"
TINY_MODEL = "tiny-clip-32"
# The same tiny CLIP with a 512-d joint embedding, as CLIP ViT-B/16's: for outside learners that
# hard-code 512 (C3Box's RAPF, ENGINE, CLG-CBM; docs/adding-a-strategy.md).
TINY_MODEL_512 = "tiny-clip-32-512"
# ...and with ViT-B/16's 64-wide attention heads in both towers too: for outside code that rebuilds
# the towers with heads = width // 64 (C3Box's PTM networks; docs/adding-a-strategy.md).
TINY_MODEL_512_H64 = "tiny-clip-32-512-h64"
# pretrained="synthetic" for a tiny model: the shipped checkpoint of
# `python -m benchmarks.miniature.pretrain --model MODEL`.
SYNTHETIC_TAG = "synthetic"
_ASSETS = Path(__file__).parent.parent / "assets"
SYNTHETIC_CHECKPOINTS = {
    model: _ASSETS / f"{model}-synthetic.safetensors"
    for model in (TINY_MODEL, TINY_MODEL_512, TINY_MODEL_512_H64)
}
SYNTHETIC_WEIGHTS = SYNTHETIC_CHECKPOINTS[TINY_MODEL]
_WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".ckpt")


@dataclass(frozen=True)
class BackboneSpec:
    """Which CLIP to build and where its weights come from."""

    model: str = DEFAULT_MODEL
    pretrained: str | None = "openai"  # open_clip tag, path to a weight file, or None (random init)
    cache_dir: str | None = None  # open_clip / Hugging Face cache to look in (default: theirs)


def shipped_checkpoint(model: str, pretrained: str | None) -> Path | None:
    """The shipped synthetic checkpoint that ``model`` with ``pretrained`` names (a tiny model with
    the tag "synthetic"), whether or not the file is there; None for any other weights."""
    return SYNTHETIC_CHECKPOINTS.get(model) if pretrained == SYNTHETIC_TAG else None


def check_model_config(name: str) -> None:
    """Fail early (before any network-capable open_clip code runs) on names we cannot build offline."""
    if ":" in name:
        raise UserError(
            f"model {name!r}: hf-hub:/local-dir: names are not supported; "
            "use a built-in open_clip name and give the weights as a file"
        )
    cfg = registry.get_model_config(name)
    if cfg is None:
        close = difflib.get_close_matches(name, registry.list_models(), n=3)
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
        repo_id, names = hub_files_of(cfg)  # open_clip prefers a safetensors twin of the listed file; either
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


def resolve_weights(spec: BackboneSpec) -> tuple[Path | None, dict[str, Any]]:
    """Return the checkpoint file to load (None = random init) and the tag's preprocessing config."""
    if spec.pretrained is None:
        return None, {}
    path = Path(spec.pretrained).expanduser()
    if path.is_file():
        return path, {}
    if (shipped := shipped_checkpoint(spec.model, spec.pretrained)) is not None:
        if not shipped.is_file():
            raise WeightsNotFoundError(
                f"{shipped} is missing; recreate it with: python -m benchmarks.miniature.pretrain "
                f"--model {spec.model}"
            )
        return shipped, {}
    cfg = check_tag(spec.model, spec.pretrained)  # a listed tag, trained with the model's activation
    found, looked = _cached_checkpoint(cfg, spec.cache_dir)
    if found is None:
        example = os.path.basename(cfg.get("url", "")) or registry.hub_weight_names()[1]
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


def check_names(model: str, pretrained: str | None) -> None:
    """Fail in one line on a model name, or an open_clip tag for it, that open_clip's registry does not
    list (or lists for the other activation), without looking for any file: a suite's check. A path
    (it has a folder or a weight file's suffix), "none" and the tiny model's synthetic tag are not tags."""
    check_model_config(model)
    path_like = pretrained is not None and ("/" in pretrained or pretrained.endswith(_WEIGHT_SUFFIXES))
    if pretrained is None or path_like or pretrained.lower() == "none" or Path(pretrained).is_file():
        return
    if shipped_checkpoint(model, pretrained) is None:
        check_tag(model, pretrained)


def check_weights(spec: BackboneSpec) -> Path | None:
    """Fail fast with a one-line error if the model name or its weights cannot be found offline."""
    check_model_config(spec.model)
    return resolve_weights(spec)[0]


def weights_digest(spec: BackboneSpec) -> str | None:
    """SHA-256 (first 16 hex digits) of a shipped synthetic checkpoint; None for any other weights.

    The tag "synthetic" names a file that is re-pretrained whenever the miniature's world changes,
    so its digest joins the hashed run config: results of an older checkpoint are never reused.
    Real weights are fixed by their open_clip tag or by the path a user gives.
    """
    shipped = shipped_checkpoint(spec.model, spec.pretrained)
    if shipped is None or not shipped.is_file():
        return None
    stat = shipped.stat()
    return _file_digest(str(shipped), stat.st_size, stat.st_mtime_ns)


def weights_file(spec: BackboneSpec) -> dict[str, str] | None:
    """The weight file a run of ``spec`` loads, as its result records it (name and SHA-256, not
    hashed: the tag or path in ``backbone`` names the weights); None for a random init or weights
    that cannot be found (the run stops on them before it records anything)."""
    try:
        path = resolve_weights(spec)[0]
    except UserError:
        return None
    if path is None:
        return None
    stat = path.stat()
    return {"file": path.name, "sha256": _file_sha256(str(path), stat.st_size, stat.st_mtime_ns)}


def recorded_backbone(backbone: dict) -> dict:
    """A run config's ``backbone`` entry (``model``, ``pretrained``, ...) as results record it:
    with ``weights_sha256`` where the weights are a shipped synthetic checkpoint."""
    digest = weights_digest(BackboneSpec(backbone["model"], backbone["pretrained"]))
    return {**backbone, "weights_sha256": digest} if digest else dict(backbone)


def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    return _file_sha256(path, size, mtime_ns)[:16]


@functools.lru_cache(maxsize=8)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:  # size and mtime key the cache
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()
