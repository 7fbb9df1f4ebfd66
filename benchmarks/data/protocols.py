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
  behaviour that the suite's defaults leave off (docs/decisions.md D4) is on (``OFFICIAL_CODE``).

Every fact names its source: repository, file and commit. The code of those repositories is not used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from benchmarks.core.errors import UserError

PROTOCOLS = ("one-protocol", "as-published")
DEFAULT_PROTOCOL = "one-protocol"

CONTINUAL_CLIP = "vgthengane/Continual-CLIP@6500b8e"
MG_CLIP = "linlany/MindtheGap@f40bfce"
RAPF = "linlany/RAPF@81d41df"


@dataclass(frozen=True)
class DataProtocol:
    """One dataset under one source's protocol. ``dataset_options`` go to the dataset loader
    (``benchmarks.data.datasets``); ``prompt_template`` is None where the source sets no prompt
    for the method (its own recipe then holds)."""

    class_order: str
    dataset_options: dict[str, Any] = field(default_factory=dict)
    prompt_template: str | None = None
    source: str = ""  # where each fact comes from


#: each source's protocol per dataset
SOURCES: dict[str, dict[str, DataProtocol]] = {
    "continual_clip": {
        "cifar100": DataProtocol(
            "dytox",
            {"class_names": "torchvision"},
            "a bad photo of a {}.",
            f"{CONTINUAL_CLIP}: class_orders/cifar100.yaml; datasets.py uses torchvision's CIFAR100 "
            "classes as they are; configs/class/cifar100_10-10.yaml prompt_template",
        ),
        "imagenet100": DataProtocol(
            "seed1993",
            {},
            "a good photo of a {}.",
            f"{CONTINUAL_CLIP}: class_orders/imagenet100.yaml (= seed 1993, checked); "
            "dataset_reqs/imagenet100_classes.txt (= OpenAI's names, checked); "
            "configs/class/imagenet100_10-10.yaml prompt_template",
        ),
        "imagenet1k": DataProtocol(
            "seed1993",
            {},
            "a good photo of a {}.",
            f"{CONTINUAL_CLIP}: class_orders/imagenet1000.yaml (= seed 1993, checked); "
            "dataset_reqs/imagenet1000_classes.txt (= OpenAI's names, checked); "
            "configs/class/imagenet1000_100-100.yaml prompt_template",
        ),
    },
    "mg_clip": {
        "cifar100": DataProtocol(
            "dytox",
            {"class_names": "torchvision"},
            "a good photo of a {}.",
            f"{MG_CLIP}: class_orders/cifar100.yaml; datasets.py uses torchvision's CIFAR100 classes "
            "as they are; configs/class/cifar100_10-10.yaml prompt_template",
        ),
        "imagenet_r": DataProtocol(
            "mg_clip_imagenet_r",
            {"split": "rapf", "class_names": "mg_clip"},
            "a good photo of a {}.",
            f"{MG_CLIP}: class_orders/imagenet_R.yaml; README points to {RAPF} "
            "imgr_split/imgr_train_test_split.txt; dataset_reqs/imagenet_R_classes.txt; "
            "configs/class/imagenet_r_20-20.yaml prompt_template",
        ),
        "imagenet100": DataProtocol(
            "seed1993",
            {},
            "a good photo of a {}.",
            f"{MG_CLIP}: class_orders/imagenet100.yaml (= seed 1993, checked); "
            "dataset_reqs/imagenet100_classes.txt (= OpenAI's names, checked); "
            "configs/class/imagenet100_10-10.yaml prompt_template",
        ),
        "imagenet1k": DataProtocol(
            "seed1993",
            {},
            "a good photo of a {}.",
            f"inferred: {MG_CLIP} has no ImageNet-1K order or config; its codebase's parent "
            f"{CONTINUAL_CLIP} class_orders/imagenet1000.yaml is seed 1993; "
            "dataset_reqs/imagenet1000_classes.txt (= OpenAI's names, checked); the template of its "
            "other configs",
        ),
    },
}

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


#: The official behaviours that the suite's defaults leave off (docs/decisions.md D4: each lets a
#: score depend on the evaluation batch or on chance), as each strategy's options, with the source.
#: Under "as-published" they are on, so a row runs as its source's code ran it. Every other official
#: behaviour is already the default, and MoE-Adapters' random-crop test transform has no option (the
#: runner owns the eval transform).
OFFICIAL_CODE: dict[str, tuple[dict[str, Any], str]] = {
    "moe4cl": (
        {"eval_gate_noise": True},
        "JiazuoYu/MoE-Adapters4CL@4572d97: the router adds its noise whatever the mode",
    ),
    "clap": (
        {"vga_context": "batch", "eval_noise": "batch"},
        "srvCodes/clap4clip@7ff95c2: the VGA attends over the whole test batch; noise drawn per batch",
    ),
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


def protocol_layer(protocol: str, strategy: str, dataset: str) -> ProtocolLayer:
    """The class order, dataset options and strategy options that ``protocol`` gives ``strategy`` on
    ``dataset``. Under ``"as-published"`` a strategy without a published row there runs under the
    suite's own protocol, as its paper number did."""
    check_protocol(protocol)
    prompt = {}
    if (source := PROMPTS.get(strategy, {}).get(dataset)) is not None:
        prompt = {"prompt_template": SOURCES[source][dataset].prompt_template}
    if protocol == "one-protocol" or (row := PUBLISHED_ROWS.get(strategy, {}).get(dataset)) is None:
        return ProtocolLayer(strategy_options=prompt, source=f"protocol.{protocol}")
    published = SOURCES[row][dataset]
    official = OFFICIAL_CODE.get(strategy, ({}, ""))[0]
    return ProtocolLayer(
        class_order=published.class_order,
        dataset_options=dict(published.dataset_options),
        strategy_options={**official, **prompt},
        source=f"protocol.{protocol}.{row}",
    )
