"""Prompt templates: one template, or an ensemble whose class feature is the renormalised mean of
the normalised per-template features (CLIP's prompt ensembling).

* "cifar": the 18 CIFAR templates of the CLIP repository's prompt-engineering notes (published
  data, kept here and nowhere else);
* "imagenet": the 80 OpenAI ImageNet templates, as open_clip ships them
  (``open_clip.zero_shot_metadata.OPENAI_IMAGENET_TEMPLATES``).
"""

from __future__ import annotations

import typing
from typing import Literal

from benchmarks.core.errors import UserError

CIFAR_TEMPLATES: tuple[str, ...] = (
    "a photo of a {}.", "a blurry photo of a {}.", "a black and white photo of a {}.",
    "a low contrast photo of a {}.", "a high contrast photo of a {}.", "a bad photo of a {}.",
    "a good photo of a {}.", "a photo of a small {}.", "a photo of a big {}.", "a photo of the {}.",
    "a blurry photo of the {}.", "a black and white photo of the {}.", "a low contrast photo of the {}.",
    "a high contrast photo of the {}.", "a bad photo of the {}.", "a good photo of the {}.",
    "a photo of the small {}.", "a photo of the big {}.",
)  # fmt: skip

PromptEnsemble = Literal["", "cifar", "imagenet"]  # "": the single prompt_template
PROMPT_ENSEMBLES = typing.get_args(PromptEnsemble)


def imagenet_templates() -> tuple[str, ...]:
    """open_clip's 80 ImageNet templates as format strings (it ships them as functions of the name)."""
    from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES  # open_clip: seconds to import

    return tuple(template("{}") for template in OPENAI_IMAGENET_TEMPLATES)


def templates(ensemble: str, single: str) -> tuple[str, ...]:
    """The templates of ``ensemble``; the empty name gives just ``single``."""
    if ensemble == "":
        return (single,)
    if ensemble == "cifar":
        return CIFAR_TEMPLATES
    if ensemble == "imagenet":
        return imagenet_templates()
    raise UserError(f"prompt_ensemble={ensemble!r} is not one of {list(PROMPT_ENSEMBLES)}")
