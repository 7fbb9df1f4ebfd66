"""A suite's backbones: its ``[backbone]`` table, each variant's own ``backbone`` (a row of other
weights, docs/decisions.md D16), and ``--weights``; checked against open_clip's registry offline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.core.errors import UserError

DEFAULT_BACKBONE = {"model": "ViT-B-16-quickgelu", "pretrained": "openai"}  # OpenAI's ViT-B/16


def check_backbones(suite: dict[str, Any], path: Path) -> None:
    """The suite's ``[backbone]`` and each variant's own ``backbone``: their keys, and their model
    and tag against open_clip's registry (offline, before any run looks for a file)."""
    from benchmarks.backbone.weights import check_names  # offline, without open_clip or torch

    tables = {"[backbone]": suite.get("backbone", {})}
    for label, variant in suite.get("variants", {}).items():
        if isinstance(variant, dict) and "backbone" in variant:
            tables[f"[variants.{label}] backbone"] = variant["backbone"]
    for where, table in tables.items():
        if not isinstance(table, dict):
            raise UserError(
                f"suite {path}: {where} must be a table, "
                'e.g. {model = "ViT-B-16", pretrained = "laion400m_e32"}'
            )
        if unknown := sorted(set(table) - {"model", "pretrained"}):
            raise UserError(f"suite {path}: {where} has unknown key(s) {unknown}; valid: model, pretrained")
        backbone = {**run_backbone(suite, None), **table}
        try:
            check_names(backbone["model"], backbone["pretrained"])
        except UserError as err:
            raise UserError(f"suite {path}: {where}: {err}") from None


def run_backbone(suite: dict[str, Any], label: str | None, weights: str | None = None) -> dict[str, Any]:
    """The backbone of the suite's run ``label`` (None: the suite's own): ``[backbone]`` over the
    default (OpenAI's ViT-B/16), the variant's ``backbone`` over both, ``weights`` (``--weights``) over
    every tag; pretrained "none" is None (random init)."""
    variant = suite.get("variants", {}).get(label, {}) if label is not None else {}
    backbone = {**DEFAULT_BACKBONE, **suite.get("backbone", {}), **variant.get("backbone", {})}
    if weights:
        backbone["pretrained"] = weights
    if str(backbone["pretrained"]).lower() == "none":
        backbone["pretrained"] = None
    return backbone
