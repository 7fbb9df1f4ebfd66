"""open_clip's registry of model names and pretrained tags, read without importing open_clip.

Importing open_clip imports torch, torchvision and transformers (about 10 s on a loaded machine),
and ``prepare weights:MODEL/TAG`` or a suite's name check only read the registry. So:

* model configs are read from open_clip's own ``model_configs/`` folder, found without importing
  the package, and from the suite's (``benchmarks/model_configs``, the tiny model), as open_clip
  scans them;
* pretrained tags come from ``assets/open_clip_pretrained.json``, open_clip's ``get_pretrained_cfg`` for
  every listed tag, written by ``python -m benchmarks.backbone.registry`` and used only while that
  open_clip version is installed (``tests/backbone/test_registry.py`` holds the two equal).

Once open_clip is imported (any run), or under another open_clip version, open_clip answers itself.
The functions keep open_clip's names and return values.
"""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

from benchmarks.core.errors import UserError

#: the suite's own model configs (the tiny CLIP), added to open_clip's by ``live_open_clip``
MODEL_CONFIG_DIR = Path(__file__).parent.parent / "model_configs"
STORED_TAGS = Path(__file__).parent.parent / "assets" / "open_clip_pretrained.json"
DISTRIBUTION = "open_clip_torch"


def get_model_config(name: str) -> dict[str, Any] | None:
    """``open_clip.get_model_config`` for a built-in name (or the suite's): the config, or None."""
    if (live := _live()) is not None:
        return live.get_model_config(name)
    config = _model_configs().get(name)
    return copy.deepcopy(config) if config is not None else None


def list_models() -> list[str]:
    if (live := _live()) is not None:
        return live.list_models()
    return list(_model_configs())


def get_pretrained_cfg(model: str, tag: str) -> dict[str, Any]:
    """``open_clip.get_pretrained_cfg``: the tag's config ({} for a tag not listed for ``model``)."""
    if (live := _live()) is not None:
        return live.get_pretrained_cfg(model, tag)
    cfg = _stored_tags().get(model, {}).get(tag.lower().replace("-", "_"), {})
    # open_clip's mean and std are tuples, which JSON stores as lists
    return {key: tuple(value) if isinstance(value, list) else value for key, value in cfg.items()}


def list_pretrained_tags_by_model(model: str) -> list[str]:
    if (live := _live()) is not None:
        return live.list_pretrained_tags_by_model(model)
    return list(_stored_tags().get(model, {}))


def hub_weight_names() -> tuple[str, str]:
    """open_clip's file names on the Hugging Face hub: (the pickled weights, their safetensors twin)."""
    if _live() is not None:
        from open_clip.constants import HF_SAFE_WEIGHTS_NAME, HF_WEIGHTS_NAME

        return HF_WEIGHTS_NAME, HF_SAFE_WEIGHTS_NAME
    names = _stored_table()["hub_weight_names"]
    return names["weights"], names["safetensors"]


def live_open_clip():
    """open_clip, imported, with the suite's model configs (the tiny CLIP) added once."""
    import open_clip

    if not any(Path(p) == MODEL_CONFIG_DIR for p in open_clip.factory._MODEL_CONFIG_PATHS):
        open_clip.add_model_config(MODEL_CONFIG_DIR)
    return open_clip


def _live():
    """open_clip itself where it is imported, or where the stored tags are of another version."""
    return live_open_clip() if "open_clip" in sys.modules or _stored() is None else None


@functools.cache
def _stored() -> dict[str, Any] | None:
    """The stored tags, where they are of the installed open_clip."""
    stored = json.loads(STORED_TAGS.read_text())
    try:
        installed = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    return stored if stored["open_clip_version"] == installed else None


def _stored_table() -> dict[str, Any]:
    """The stored table, read where ``_live`` left the answer to it (so it is of this version)."""
    stored = _stored()
    if stored is None:
        raise RuntimeError("the stored open_clip table is of another open_clip version; ask open_clip")
    return stored


def _stored_tags() -> dict[str, dict[str, dict[str, Any]]]:
    return _stored_table()["pretrained"]


def _natural_key(name: str) -> list[int | str]:  # open_clip's order of model names
    return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", name.lower())]


@functools.cache
def _model_configs() -> dict[str, dict[str, Any]]:
    """Every config file open_clip would list, in its order: a file is a model config when it
    names ``embed_dim``, ``vision_cfg`` and ``text_cfg``, as open_clip's scan requires."""
    spec = importlib.util.find_spec("open_clip")  # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise UserError("open_clip is not installed; install the suite with pip install -e .")
    folders = [Path(spec.submodule_search_locations[0]) / "model_configs", MODEL_CONFIG_DIR]
    configs: dict[str, dict[str, Any]] = {}
    for folder in folders:
        for path in folder.glob("*.json"):
            config = json.loads(path.read_text())
            if all(key in config for key in ("embed_dim", "vision_cfg", "text_cfg")):
                configs[path.stem] = config
    return dict(sorted(configs.items(), key=lambda item: _natural_key(item[0])))


def stored_table() -> dict[str, Any]:
    """What ``open_clip_pretrained.json`` holds, from the installed open_clip (which it imports)."""
    import open_clip
    from open_clip import pretrained
    from open_clip.constants import HF_SAFE_WEIGHTS_NAME, HF_WEIGHTS_NAME

    return {
        "source": "open_clip.get_pretrained_cfg for every tag of open_clip.list_pretrained(); "
        "regenerate with: python -m benchmarks.backbone.registry",
        "open_clip_version": importlib.metadata.version(DISTRIBUTION),
        "hub_weight_names": {"weights": HF_WEIGHTS_NAME, "safetensors": HF_SAFE_WEIGHTS_NAME},
        "pretrained": {
            model: {
                tag: open_clip.get_pretrained_cfg(model, tag)
                for tag in pretrained.list_pretrained_tags_by_model(model)
            }
            for model in dict.fromkeys(model for model, _ in open_clip.list_pretrained())
        },
    }


if __name__ == "__main__":
    from benchmarks.core.atomic_io import atomic_write_text

    # open_clip's order of models and tags kept: list_pretrained_tags_by_model returns it
    atomic_write_text(STORED_TAGS, json.dumps(stored_table(), indent=1) + "\n")
    print(f"wrote {STORED_TAGS}")
