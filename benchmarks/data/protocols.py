"""The evaluation protocols behind published numbers, as data: one table, read by the suites.

A *data protocol* is what a number depends on besides the method: the class order, the ImageNet-R
split, the class names, and, for the methods whose only recipe is a prompt (Continual-CLIP; MG-CLIP's
codebase), the prompt template. GR4CIL's Table 1 mixes protocols: most baseline rows are the numbers
MG-CLIP reported, under MG-CLIP's codebase; GR4CIL and AdapterVLM ran under GR4CIL's own
(docs/baselines.md §3). A suite picks one with its ``protocol`` key:

* ``"one-protocol"`` (``main``): every strategy under the suite's order, split and names
  (docs/decisions.md P1); only the prompt of ``PROMPTS`` is applied, since it is the method's recipe.
* ``"as-published"`` (``main-as-published``): each strategy under the protocol of the paper its
  Table 1 number comes from (``PUBLISHED_ROWS``), and as its official code ran: every official
  behaviour that the suite's defaults leave off (docs/decisions.md D4) is on. Those are options
  of a method, so its card holds them (``strategies/methods/<name>.toml``, ``[official]``) and
  the suite passes them in.

Every fact names its source: repository, file and commit. The code of those repositories is not used.
The facts about a dataset (its order, options and template under each source) are held by its unit
(``DatasetUnit.published``, ``benchmarks/data/units/``); which source each published row and prompt
came from is here; a method's own options are on its card.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from benchmarks.core.errors import UserError
from benchmarks.data.unit import CONTINUAL_CLIP, MG_CLIP, RAPF, DataProtocol, iter_published

__all__ = ["CONTINUAL_CLIP", "MG_CLIP", "RAPF", "DataProtocol"]  # where the units' facts come from

PROTOCOLS = ("one-protocol", "as-published")
DEFAULT_PROTOCOL = "one-protocol"


def _sources() -> dict[str, dict[str, DataProtocol]]:
    """Each source's protocol per dataset, read from the dataset units (``DatasetUnit.published``)."""
    table: dict[str, dict[str, DataProtocol]] = {}
    for source, dataset, protocol in iter_published():
        table.setdefault(source, {})[dataset] = protocol
    return table


#: each source's protocol per dataset
SOURCES: dict[str, dict[str, DataProtocol]] = _sources()

#: Table 1 rows: which source's protocol each strategy's published number comes from, per dataset.
#: A strategy or dataset absent here ran under GR4CIL's own protocol, the suite's (``main``):
#: GR4CIL itself, AdapterVLM (re-run by GR4CIL with seed 1993) and fine-tuning.
_MG_CLIP_TABLE = {d: "mg_clip" for d in SOURCES["mg_clip"]}
PUBLISHED_ROWS: dict[str, dict[str, str]] = {
    # Continual-CLIP's own paper, except ImageNet-R, which it never ran (MG-CLIP's table)
    "continual_clip": {**_MG_CLIP_TABLE, **{d: "continual_clip" for d in SOURCES["continual_clip"]}},
    # GR4CIL's appendix: taken from MG-CLIP's reported table (MG-CLIP publishes no baseline code,
    # so its data protocol is assumed for them; the methods' own prompts are their recipes)
    **dict.fromkeys(
        ("mg_clip", "moe4cl", "magmax", "l2p_pp", "dualprompt", "coda_prompt", "aper_adapter", "clap"),
        _MG_CLIP_TABLE,
    ),
}

#: The template a prompt-only recipe uses, per dataset, under either protocol: Continual-CLIP's
#: number is its prompt (docs/decisions.md D10); ImageNet-R, which it never ran, takes MG-CLIP's.
PROMPTS: dict[str, dict[str, str]] = {
    "continual_clip": {d: "continual_clip" for d in SOURCES["continual_clip"]} | {"imagenet_r": "mg_clip"},
}


@dataclass(frozen=True)
class ProtocolLayer:
    """What a protocol sets for one run: a class order (None: the suite's), dataset options and
    strategy options, and the source each came from."""

    class_order: str | None = None
    dataset_options: dict[str, Any] = field(default_factory=dict)
    strategy_options: dict[str, Any] = field(default_factory=dict)
    source: str = ""


def check_protocol(name: str) -> str:
    if name not in PROTOCOLS:
        raise UserError(f"unknown protocol {name!r}; valid: {', '.join(PROTOCOLS)}")
    return name


def protocol_layer(
    protocol: str, strategy: str, dataset: str, official_options: Mapping[str, Any] | None = None
) -> ProtocolLayer:
    """The class order, dataset options and strategy options that ``protocol`` gives ``strategy`` on
    ``dataset``; ``official_options``: the behaviours of its official code that the suite's defaults
    leave off (its card's), on under ``"as-published"``. There a strategy without a published row
    on ``dataset`` runs under the suite's own protocol, as its paper number did."""
    check_protocol(protocol)
    prompt = {}
    if (source := PROMPTS.get(strategy, {}).get(dataset)) is not None:
        prompt = {"prompt_template": SOURCES[source][dataset].prompt_template}
    if protocol == "one-protocol" or (row := PUBLISHED_ROWS.get(strategy, {}).get(dataset)) is None:
        return ProtocolLayer(strategy_options=prompt, source=f"protocol.{protocol}")
    published = SOURCES[row][dataset]
    return ProtocolLayer(
        class_order=published.class_order,
        dataset_options=dict(published.dataset_options),
        strategy_options={**(official_options or {}), **prompt},
        source=f"protocol.{protocol}.{row}",
    )
