"""Pretrained weights by open_clip tag, read from open_clip's own registry (``registry``: without
importing open_clip where it can), never from the network.

``check_tag`` says in one line what is wrong with a model and tag pair: a tag open_clip does not list
for the model (the closest ones it does list), or weights trained with the other activation (OpenAI's
weights, and a few LAION ones, were trained with QuickGELU: open_clip's ``-quickgelu`` model names
build that; features of the other build are silently off, so the pair is refused). ``url_checksum``
is the SHA-256 a tag's download URL carries, ``manual_file`` where a file downloaded by hand goes
(where ``benchmarks.backbone.weights`` looks for it).
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any

from benchmarks.backbone import registry
from benchmarks.core.errors import UserError, WeightsNotFoundError

QUICKGELU = "-quickgelu"
#: open_clip's cache of files downloaded from a URL; also where hub-only files downloaded by hand go
CLIP_CACHE = "~/.cache/clip"
HUB_URL = "https://huggingface.co"


def _activation(quick_gelu: bool) -> str:
    return "QuickGELU" if quick_gelu else "GELU"


def sibling_model(model: str) -> str | None:
    """The same architecture built with the other activation (``ViT-B-16`` and ``ViT-B-16-quickgelu``),
    where open_clip knows it."""
    other = model.removesuffix(QUICKGELU) if model.endswith(QUICKGELU) else model + QUICKGELU
    return other if registry.get_model_config(other) is not None else None


def check_tag(model: str, tag: str) -> dict[str, Any]:
    """open_clip's config of weights ``tag`` for ``model`` (a name open_clip knows); a one-line error
    for a tag it does not list there, or for weights trained with the activation ``model`` does not use."""
    cfg = registry.get_pretrained_cfg(model, tag)
    sibling = sibling_model(model)
    if not cfg:
        if sibling and registry.get_pretrained_cfg(sibling, tag):
            raise WeightsNotFoundError(
                f"open_clip lists pretrained={tag!r} for {sibling}, not for {model}; use model = {sibling!r}"
            )
        tags = registry.list_pretrained_tags_by_model(model)
        close = difflib.get_close_matches(tag, tags, n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise WeightsNotFoundError(
            f"pretrained={tag!r} for {model} is neither a file nor a known open_clip tag ({hint}tags: "
            f"{', '.join(tags) or 'none'}); pass a path to a weight file, or 'none' for random init"
        )
    trained = bool(cfg.get("quick_gelu", False))
    builds = bool((registry.get_model_config(model) or {}).get("quick_gelu", False))
    if trained != builds:
        use = f"use model = {sibling!r}" if sibling else "choose another tag"
        raise UserError(
            f"the {tag!r} weights of {model} were trained with {_activation(trained)}, but {model} "
            f"builds {_activation(builds)}: every feature would be off; {use}"
        )
    return cfg


def url_checksum(cfg: dict[str, Any]) -> str | None:
    """The SHA-256 a tag's download URL carries, or its first hex digits: OpenAI's URLs name the file's
    whole SHA-256 as their last folder, open_clip's release files (github.com/mlfoundations/open_clip)
    end their name in its first 8 digits, as open_clip's own URL download checks them. None: no URL,
    or one that carries none."""
    url = cfg.get("url", "")
    if not url:
        return None
    folder, name = url.rsplit("/", 2)[-2:]
    if "openaipublic" in url and re.fullmatch(r"[0-9a-f]{64}", folder):
        return folder
    suffix = os.path.splitext(name)[0].rsplit("-", 1)[-1]
    if "mlfoundations/open_clip/releases" in url and re.fullmatch(r"[0-9a-f]{8}", suffix):
        return suffix
    return None


def hub_files_of(cfg: dict[str, Any]) -> tuple[str, list[str]]:
    """``hub_files`` of a tag that has no URL, so that it is on the hub."""
    if (files := hub_files(cfg)) is None:
        raise ValueError(f"a pretrained tag with neither a URL nor a hub file: {cfg}")
    return files


def hub_files(cfg: dict[str, Any]) -> tuple[str, list[str]] | None:
    """A tag's Hugging Face hub repository and its file names, the safetensors twin first (open_clip
    prefers it); None for a tag that is not on the hub."""
    if not cfg.get("hf_hub"):
        return None
    weights_name, safetensors_name = registry.hub_weight_names()
    repo, filename = os.path.split(cfg["hf_hub"])  # "org/name/" names the repository's default file
    filename = filename or weights_name
    names = [filename]
    if filename == weights_name:
        names.insert(0, safetensors_name)
    elif filename.endswith((".bin", ".pth")):
        names.insert(0, filename[:-4] + ".safetensors")
    return repo, names


def manual_file(cfg: dict[str, Any], cache_dir: str | None = None) -> Path:
    """Where a file of the tag downloaded by hand goes, for runs to find it: the URL's file name in
    open_clip's cache folder; for a tag only on the hub, ``REPO/FILE`` under that folder."""
    root = Path(cache_dir or CLIP_CACHE).expanduser()
    if cfg.get("url"):
        return root / os.path.basename(cfg["url"])
    repo, names = hub_files_of(cfg)
    return root / repo / names[0]


def download_url(cfg: dict[str, Any]) -> str:
    """Where the tag's file can be downloaded by hand: its URL, else its hub file's address."""
    if cfg.get("url"):
        return cfg["url"]
    repo, names = hub_files_of(cfg)
    return f"{HUB_URL}/{repo}/resolve/main/{names[0]}"
