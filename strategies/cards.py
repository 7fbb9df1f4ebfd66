"""Each method's card: the facts about a method that the report, the paper tables, the figures, the
as-published protocol and the GPU check read, kept beside its file as plain data
(``strategies/methods/<name>.toml`` beside ``<name>.py``).

A card is read without importing its method, so the commands that read results never load torch,
open_clip or Avalanche for it. A method without a card (a user's ``module:Class``) has none of
these facts: it is shown under its own label, in a fallback style, with no official options.
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

METHODS_DIR = Path(__file__).resolve().parent / "methods"


@dataclass(frozen=True)
class MethodCard:
    name: str  # the registered name, its files' stem
    title: str  # its row in the report's tables and figures
    recipe: str  # where its recipe comes from (docs/baselines.md's section, docs/decisions.md)
    tests: tuple[str, ...]  # the test modules that hold it to that recipe
    # one of the GPU goals' "LoRA strategies" (docs/running.md): its step trains low-rank, expert or
    # full-tuning modules inside the towers, so the GPU check holds it to the step goals
    lora: bool
    color: str  # its line colour in every figure
    marker: str  # and its marker: no two methods share either
    paper_row: str | None = None  # its row in GR4CIL's tables; None: not a paper row
    # options the official code has on that the suite's defaults leave off (docs/decisions.md D4),
    # turned on by the as-published protocol, and where they come from
    official_options: dict[str, Any] = field(default_factory=dict)
    official_source: str = ""


_REQUIRED = {"title", "recipe", "tests", "lora", "style"}
_FIELDS = _REQUIRED | {"paper_row", "official"}


def read_card(path: Path) -> MethodCard:
    """The card in ``path``; a missing, unknown or mistyped field is a ValueError naming the file."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    wrong = sorted(data.keys() - _FIELDS) + sorted(
        {"title", "recipe", "tests", "lora", "style"} - data.keys()
    )
    if wrong:
        raise ValueError(f"{path}: unknown or missing fields {wrong} (a card holds {sorted(_FIELDS)})")
    official = data.get("official", {})
    card = MethodCard(
        name=path.stem,
        title=data["title"],
        recipe=data["recipe"],
        tests=tuple(data["tests"]),
        lora=data["lora"],
        color=data["style"]["color"],
        marker=data["style"]["marker"],
        paper_row=data.get("paper_row"),
        official_options=dict(official.get("options", {})),
        official_source=official.get("source", ""),
    )
    if not isinstance(card.lora, bool) or not all(isinstance(t, str) for t in card.tests):
        raise ValueError(f"{path}: lora is true or false, and tests a list of module names")
    if card.official_options and not card.official_source:
        raise ValueError(f"{path}: [official] options need their source")
    return card


@functools.cache
def cards() -> dict[str, MethodCard]:
    """Every method's card by name, in name order."""
    return {path.stem: read_card(path) for path in sorted(METHODS_DIR.glob("*.toml"))}


def card_of(name: str) -> MethodCard | None:
    """The card of the method registered as ``name``; None for a strategy without one."""
    return cards().get(name)
