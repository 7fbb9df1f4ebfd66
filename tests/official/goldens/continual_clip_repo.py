"""Golden outputs of Continual-CLIP's official code (``vgthengane/Continual-CLIP``, the suite's
``continual_clip``).

The official zero-shot classifier is ``ClassIncrementalCLIP`` (``continual_clip/models.py``): per
task, ``adaptation`` appends the task's class names (``get_class_names`` over the class order) and
tokenises ``prompt_template.format(name)`` for every class seen so far with ``clip.tokenize``;
``forward`` calls OpenAI CLIP's ``model(image, text_tokens)`` (both features normalised, logits =
``logit_scale.exp()`` times the cosines) and returns the softmax. It is run as ``main.py``'s
``run_class_incremental`` runs it, without the data: the config read from
``configs/class/cifar100_10-10.yaml``, the class order from ``class_orders/cifar100.yaml`` with the
official ``get_class_order``, the class names torchvision's CIFAR-100 names as they are (what
``datasets.py`` passes: ``dataset.dataset.classes``).

The model both sides use is the suite's tiny CLIP with its shipped synthetic weights: ``clip.load``
is replaced by a loader that builds OpenAI's own ``clip.model.CLIP`` (``openai/CLIP``, the package
Continual-CLIP's ``setup_environment.sh`` installs, imported from its checkout) at the tiny model's
configuration and loads the tiny checkpoint's text tower and logit scale into it; ``clip.tokenize``
is OpenAI's. The image features are seeded inputs: OpenAI CLIP's visual tower is replaced by a
pass-through, so ``encode_image`` returns them unchanged.

Component ``continual_clip.zero_shot``: after each of the 10 tasks, the official logits and
probabilities on the seeded image features; the token ids and the (unnormalised) text features of
the 100 prompts.
"""

from __future__ import annotations

import importlib
import json
import math
import sys
import types
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from benchmarks.backbone import TINY_MODEL
from benchmarks.backbone.loading import SYNTHETIC_WEIGHTS
from benchmarks.data.units.cifar100 import CIFAR100_CLASSES
from tests.official.goldens import component
from tests.official.goldens.golden import Golden, Official, official_import_path, stub_module

OFFICIAL = Official(
    repository="vgthengane/Continual-CLIP",
    commit="6500b8e0874e972e60fd7b296e1287fda1dffcaa",
    folder="Continual-CLIP",
)
# The CLIP package Continual-CLIP installs (setup_environment.sh: pip install git+https://github.com/openai/CLIP.git)
OPENAI_CLIP = Official(
    repository="openai/CLIP", commit="d05afc436d78f1c48dc0dbf8e5980a9d471f35f6", folder="CLIP"
)
CONFIG = "configs/class/cifar100_10-10.yaml"
CLASS_ORDER = "class_orders/cifar100.yaml"
TINY_CONFIG = Path(__file__).resolve().parents[3] / "benchmarks" / "model_configs" / f"{TINY_MODEL}.json"
SEED = 51
BATCH = 8


class _Features(nn.Module):
    """OpenAI CLIP's visual tower replaced: the images are the fixture's features. ``conv1`` only
    gives OpenAI's ``dtype`` property its float32."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _tiny_openai_clip(openai_model: types.ModuleType) -> nn.Module:
    """OpenAI's ``clip.model.CLIP`` at the tiny CLIP's configuration, with the synthetic checkpoint's
    text tower and logit scale (its tensor names are OpenAI's), the visual tower a pass-through."""
    cfg = json.loads(TINY_CONFIG.read_text())
    vision, text = cfg["vision_cfg"], cfg["text_cfg"]
    if not cfg.get("quick_gelu"):
        raise RuntimeError("OpenAI's CLIP uses QuickGELU; the tiny model must too")
    model = openai_model.CLIP(
        embed_dim=cfg["embed_dim"],
        image_resolution=vision["image_size"],
        vision_layers=vision["layers"],
        vision_width=vision["width"],
        vision_patch_size=vision["patch_size"],
        context_length=text["context_length"],
        vocab_size=text["vocab_size"],
        transformer_width=text["width"],
        transformer_heads=text["heads"],
        transformer_layers=text["layers"],
    )
    weights = {k: v for k, v in load_file(str(SYNTHETIC_WEIGHTS)).items() if not k.startswith("visual.")}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected or any(not k.startswith("visual.") for k in missing):
        raise RuntimeError(f"tiny weights do not fit OpenAI's CLIP: {missing}, {unexpected}")
    model.visual = _Features()
    return model.float().eval()


def _config(checkout: Path) -> types.SimpleNamespace:
    """The official config file, its one interpolation (``increment: ${initial_increment}``)
    resolved as hydra would; the class order as ``run_class_incremental`` sets it."""
    import yaml  # the official configs' format; PyYAML comes with peft and timm, needed only here

    values = yaml.safe_load((checkout / CONFIG).read_text())
    values.pop("hydra")
    for key, value in values.items():
        if isinstance(value, str) and value.startswith("${") and value.endswith("}"):
            values[key] = values[value[2:-1]]
    values["class_order"] = CLASS_ORDER
    return types.SimpleNamespace(**values)


LOADING = (
    "continual_clip/models.py and continual_clip/utils.py imported from the checkout with stubs: clip "
    "(its load returns OpenAI's clip.model.CLIP from the openai/CLIP checkout at "
    f"{OPENAI_CLIP.commit[:12]}, built at the tiny CLIP's configuration with its synthetic text weights "
    "and logit scale, the visual tower a pass-through for the seeded image features; its tokenize is "
    "OpenAI's clip.tokenize) and omegaconf (not installed; models.py and utils.py import it for a type "
    "and for saving configs only). The config file is read with PyYAML (hydra is not run); main.py "
    "(hydra, continuum, the datasets) is not imported: its run_class_incremental steps are taken by hand "
    "(get_class_order, load_model, classes_names, adaptation(task) and forward per task)."
)


@component("continual_clip.zero_shot", OFFICIAL)
def zero_shot(checkout: Path) -> Golden:
    clip_checkout = OPENAI_CLIP.checkout(checkout.parent)
    image = torch.randn(
        BATCH, json.loads(TINY_CONFIG.read_text())["embed_dim"], generator=torch.Generator().manual_seed(SEED)
    )
    tensors: dict[str, torch.Tensor] = {"input.image": image}
    with official_import_path(clip_checkout):
        openai_clip = importlib.import_module("clip")
        model = _tiny_openai_clip(sys.modules["clip.model"])
        stubs = {
            "clip": stub_module("clip", load=lambda *a, **k: (model, None), tokenize=openai_clip.tokenize),
            "omegaconf": stub_module("omegaconf", DictConfig=dict, OmegaConf=None),
        }
        with official_import_path(checkout, stubs):
            models = importlib.import_module("continual_clip.models")
            utils = sys.modules["continual_clip.utils"]
            cfg = _config(checkout)
            cfg.class_order = utils.get_class_order(str(checkout / cfg.class_order))
            classifier = models.load_model(cfg, torch.device("cpu"))
            classifier.classes_names = list(CIFAR100_CLASSES)
            captured: dict[str, torch.Tensor] = {}
            encode_text = classifier.model.encode_text

            def traced_encode_text(text):
                captured["text_features"] = encode_text(text)
                return captured["text_features"]

            classifier.model.encode_text = traced_encode_text
            classifier.model.register_forward_hook(
                lambda module, args, output: captured.__setitem__("logits", output[0])
            )
            tasks = len(classifier.class_ids_per_task)
            for task in range(tasks):
                classifier.adaptation(task)
                probs = classifier(image)
                tensors[f"output.logits.task{task}"] = captured["logits"]
                tensors[f"output.probs.task{task}"] = probs
            tensors["output.tokens"] = classifier.text_tokens
            tensors["output.text_features"] = captured["text_features"]
            tensors["input.class_order"] = torch.tensor(cfg.class_order)
            tensors["output.logit_scale"] = model.logit_scale.exp().detach()
            template = cfg.prompt_template
    if template != "a bad photo of a {}.":
        raise RuntimeError(f"the official CIFAR-100 template is now {template!r}")
    return Golden(
        component="continual_clip.zero_shot",
        official=OFFICIAL,
        file="continual_clip/models.py",
        function="ClassIncrementalCLIP (load_model, adaptation, forward), as main.py's run_class_incremental "
        "drives it; OpenAI's clip.model.CLIP.forward and clip.tokenize inside",
        loading=LOADING,
        seed=SEED,
        sizes={
            "batch": BATCH,
            "tasks": tasks,
            "classes": len(cfg.class_order),
            "initial_increment": cfg.initial_increment,
            "increment": cfg.increment,
        },
        tensors=tensors,
        notes=(
            f"Config {CONFIG}: prompt_template {template!r}, 10 tasks of 10 classes, the class order of "
            f"{CLASS_ORDER} (the DyTox order). Class names: torchvision's CIFAR-100 names, unchanged "
            "(aquarium_fish), the suite's benchmarks.data.units.cifar100.CIFAR100_CLASSES. "
            "Model: the tiny CLIP "
            f"({TINY_MODEL}, synthetic weights) as OpenAI's CLIP class, text tower and logit scale "
            f"(exp = {math.exp(float(load_file(str(SYNTHETIC_WEIGHTS))['logit_scale'])):.4f}). "
            "input.image: raw image features (normalised by the official forward). "
            "output.logits.taskT / output.probs.taskT: [B, 10 (T + 1)] after task T's adaptation, columns in "
            "the order of the classes seen. output.tokens and output.text_features (unnormalised, "
            "encode_text's output): the 100 prompts after the last task."
        ),
    )
