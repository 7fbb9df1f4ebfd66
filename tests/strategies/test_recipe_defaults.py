"""Each baseline's recipe defaults are pinned against docs/baselines.md (issue 63, item 4): the
optimiser, learning rate, weight decay, momentum, gradient clipping, schedule, warm-up, batch and
epochs of each config class (its CIFAR-100 values; the suites set the other datasets') equal the
values its section of docs/baselines.md gives, and the section says them in these words. A default
changed in the code, or a number changed in the docs, fails here, whatever the loop tests' own
settings are."""

import dataclasses
import importlib
import re
from pathlib import Path

import pytest

BASELINES = Path(__file__).resolve().parents[2] / "docs" / "baselines.md"
PROMPTS = "8. Shared parts of the three prompt methods"

#: strategy -> (its config class, the section of docs/baselines.md, {field: (default, its words there)})
RECIPES = {
    "adaptervlm": (
        "AdapterVLMConfig",
        "4. AdapterVLM",
        {
            "optimizer": ("adamw", "| optimiser | AdamW,"),
            "lr": (5e-3, "lr 5e-3"),
            "weight_decay": (0.1, "wd 0.1"),
            "schedule": ("cosine_iter", "| schedule | cosine per iteration, to 0, no warm-up"),
            "warmup_steps": (0, "no warm-up"),
            "epochs": (50, "| epochs | 50 CIFAR-100"),
            "batch_size": (100, "| batch | 100 CIFAR-100"),
        },
    ),
    "mg_clip": (
        "MGCLIPConfig",
        "5. MG-CLIP",
        {
            "optimizer": ("adam", "| optimiser / schedule | Adam, wd 0"),
            "weight_decay": (0.0, "Adam, wd 0"),
            "schedule": ("cosine_epoch", "cosine per epoch, floor 0.01·lr"),
            "min_lr_ratio": (0.01, "floor 0.01·lr"),
            "lr": (1e-3, "| lr | 1e-3 CIFAR-100"),
            "batch_size": (128, "| batch | 128 CIFAR-100"),
            "epochs": (1, "| epochs | 1 / 2 / 2 /"),
        },
    ),
    "moe4cl": (
        "MOE4CLConfig",
        "6. MOE4CL",
        {
            "optimizer": ("adamw", "| optimiser | AdamW,"),
            "lr": (1e-3, "lr 1e-3"),
            "weight_decay": (0.0, "wd 0,"),
            "schedule": ("cosine_iter", "cosine to 0, per iteration"),
            "warmup_steps": (30, "30 linear warm-up steps"),
            "epochs": (1, "| epochs / batch | 1 / 128"),
            "batch_size": (128, "| epochs / batch | 1 / 128"),
        },
    ),
    "magmax": (
        "MagMaxConfig",
        "7. MagMax",
        {
            "optimizer": ("adamw", "| optimiser / batch | AdamW,"),
            "lr": (1e-5, "lr 1e-5"),
            "weight_decay": (0.1, "wd 0.1 / 128"),
            "batch_size": (128, "wd 0.1 / 128"),
            "schedule": ("cosine_iter", "then cosine, per iteration"),
            "warmup_steps": (500, "500 linear warm-up steps"),
            "grad_clip": (1.0, "| grad clip / precision | 1.0 /"),
            "epochs": (10, "| epochs | 10 CIFAR-100"),
        },
    ),
    **{
        name: (
            config,
            PROMPTS,
            {
                "optimizer": ("adam", "Adam (β = (0.9, 0.999))"),
                "lr": (1e-3, "lr 1e-3"),
                "weight_decay": (0.0, "wd 0"),
                "batch_size": (128, "batch 128"),
                "schedule": ("coda_cosine", "`coda_cosine`"),
                "epochs": (20, "**Epochs.** 20 CIFAR-100"),
            },
        )
        for name, config in (
            ("l2p_pp", "L2PConfig"),
            ("dualprompt", "DualPromptConfig"),
            ("coda_prompt", "CodaConfig"),
        )
    },
    "aper_adapter": (
        "AperConfig",
        "12. APER-Adapter",
        {
            "optimizer": ("sgd", "| optimiser | SGD, momentum 0.9"),
            "momentum": (0.9, "momentum 0.9"),
            "lr": (0.01, "lr 0.01"),
            "weight_decay": (5e-4, "wd 5e-4"),
            "batch_size": (48, "| batch / epochs / schedule | 48 (ImageNet-R: 24) / 20 /"),
            "epochs": (20, "/ 20 / cosine per epoch to 0"),
            "schedule": ("cosine_epoch", "cosine per epoch to 0"),
        },
    ),
    "clap": (
        "CLAPConfig",
        "13. CLAP",
        {
            "optimizer": ("sgd", "| optimiser | SGD, momentum 0"),
            "momentum": (0.0, "momentum 0"),
            "weight_decay": (0.0, "wd 0"),
            "lr": (0.0, "`lr = 0` applies the rule"),
            "schedule": ("cosine_iter", "cosine to lr × 1e-3, per iteration"),
            "min_lr_ratio": (1e-3, "cosine to lr × 1e-3"),
            "batch_size": (32, "| batch / epochs | 32 / 5"),
            "epochs": (5, "| batch / epochs | 32 / 5"),
        },
    ),
}


def _section(title: str) -> str:
    text = BASELINES.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


@pytest.mark.parametrize("strategy", sorted(RECIPES))
def test_each_recipe_default_is_the_one_docs_baselines_gives(strategy):
    config_name, title, fields = RECIPES[strategy]
    config = getattr(importlib.import_module(f"strategies.methods.{strategy}"), config_name)
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    section = _section(title)
    for field, (value, words) in fields.items():
        assert defaults[field] == value, f"{config_name}.{field} = {defaults[field]!r}, the recipe {value!r}"
        assert words in section, f"docs/baselines.md §{title} no longer says {words!r} ({field})"


def test_every_trained_baseline_with_a_recipe_section_is_pinned():
    """A baseline added to docs/baselines.md's numbered sections gets its row here."""
    titles = re.findall(r"^## \d+\. (.+)$", BASELINES.read_text(encoding="utf-8"), flags=re.M)
    methods = {
        "AdapterVLM",
        "MG-CLIP",
        "MOE4CL",
        "MagMax",
        "L2P++",
        "DualPrompt",
        "CODA-Prompt",
        "APER-Adapter",
        "CLAP",
    }
    assert methods <= set(titles)
    assert {title for title in titles if title in methods} == methods
    assert len(RECIPES) == len(methods)
