"""MindtheGap's official runners (``main.py``, ``epoch.py``: ``run_class_incremental``) driven offline,
for the ``mg_clip.fusion`` and ``mg_clip.epoch_probe`` goldens of ``mindthegap_repo``: a stand-in
CLIP with seeded features, continuum's scenarios as lists of tasks, stubs for what the runs never
use, and the hydra config the runners read. They write ori_params.pth, trainable_params.pth and
final_model.pth to the working folder: the goldens run them in a temporary one (``contextlib.chdir``).
"""

from __future__ import annotations

import types
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import ConcatDataset

from tests.official.goldens.golden import stub_module

TEMPLATE = "a good photo of a {}."  # configs/class/*.yaml prompt_template


def _runner_stubs(checkout: Path, extra: dict[str, types.ModuleType]) -> dict[str, types.ModuleType]:
    """Stand-ins for what main.py / epoch.py import but the runs here never use (hydra, omegaconf,
    continuum, sklearn) or cannot use offline (clip, loraclip's downloads), plus ``extra``."""

    class _Logger:  # continuum.metrics.Logger: only its numbers for the JSON log
        accuracy = average_incremental_accuracy = forgetting = 0.0
        backward_transfer = forward_transfer = 0.0
        accuracy_per_task: list[float] = []

        def __init__(self, *args, **kwargs):
            pass

        def add(self, *args, **kwargs):
            pass

        def end_task(self):
            pass

    stubs = {
        "hydra": stub_module("hydra", main=lambda **kwargs: lambda f: f),
        "omegaconf": stub_module(
            "omegaconf", DictConfig=dict, OmegaConf=types.SimpleNamespace(save=lambda *a, **k: None)
        ),
        "continuum": stub_module("continuum", ClassIncremental=None, InstanceIncremental=None),
        "continuum.metrics": stub_module("continuum.metrics", Logger=_Logger),
        "continuum.rehearsal": stub_module("continuum.rehearsal", RehearsalMemory=None),
        "sklearn": stub_module("sklearn"),
        "sklearn.cluster": stub_module("sklearn.cluster", KMeans=None),
        "clip.model": stub_module("clip.model", VisionTransformer=None),
    }
    stubs["continuum"].rehearsal = stubs["continuum.rehearsal"]
    stubs.update(extra)
    return stubs


class StubCLIP(nn.Module):
    """Stands in for the LoRA CLIP that ``lora_clip.load`` would download. ``encode_image`` takes
    sample ids and returns seeded features of the current state (state s: after the model's s-th
    switch to eval mode, 0 before training; the probe's "training" is this schedule of states),
    ``encode_text`` takes the prompt ids of the ``clip.tokenize`` stub. ``forward`` is bound to the
    official ``forward_clip`` by ``ClassIncrementalCLIP``."""

    def __init__(self, images: torch.Tensor, texts: torch.Tensor, logit_scale: torch.Tensor) -> None:
        super().__init__()
        self.images = images  # [states, samples, d]
        self.texts = texts  # [prompts, d]
        self.logit_scale = nn.Parameter(logit_scale.clone(), requires_grad=False)
        self.lora_stand_in = nn.Parameter(torch.zeros(()))  # what the optimiser holds (gradient 0)
        self.evals = 0
        self.calls: list[tuple[bool, int, torch.Tensor]] = []  # (grad on, state, sample ids)

    def train(self, mode: bool = True):
        self.evals += not mode
        return super().train(mode)

    def encode_image(self, ids: torch.Tensor) -> torch.Tensor:
        state = min(max(self.evals - 1, 0), len(self.images) - 1)
        self.calls.append((torch.is_grad_enabled(), state, ids.clone()))
        return self.images[state][ids] + 0 * self.lora_stand_in

    def encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.texts[tokens[:, 0]]


class Tasks(list):
    """continuum's scenario as main.py uses it: ``scenario[t]`` a task, ``scenario[:t]`` tasks joined."""

    def __getitem__(self, index):
        if isinstance(index, slice):
            return ConcatDataset(list.__getitem__(self, index))
        return list.__getitem__(self, index)


def run_stubs(checkout, model: StubCLIP, prompts: dict[str, int], train, test, class_names):
    """Stubs for one official run: the model loader, the tokenizer and the scenarios."""
    tokenize = lambda texts: torch.tensor([[prompts[t]] for t in texts])  # noqa: E731
    return _runner_stubs(
        checkout,
        {
            "clip": stub_module("clip", tokenize=tokenize),
            "loraclip": stub_module(
                "loraclip",
                lora_clip=stub_module("loraclip.lora_clip", load=lambda *a, **k: (model, None)),
            ),
            "continual_clip.datasets": stub_module(
                "continual_clip.datasets",
                build_cl_scenarios=lambda cfg, is_train, transforms: (
                    (train if is_train else test),
                    class_names,
                ),
            ),
        },
    )


def runner_config(folder: Path, class_order: list[int], **options) -> types.SimpleNamespace:
    """The hydra config main.py / epoch.py read (configs/class/cifar100_10-10.yaml's fields)."""
    (folder / "order.yaml").write_text("class_order: [" + ", ".join(map(str, class_order)) + "]\n")
    base = {
        "class_order": "order.yaml",
        "workdir": str(folder),
        "log_path": str(folder / "metric.json"),
        "model_name": "ViT-B/16",
        "prompt_template": TEMPLATE,
        "scenario": "class",
        "num_workers": 0,
        "lora_rank": 8,
        "lora_mode": "vision+only_kv+text",
        "reset": False,
        "only_reset_B": False,
        "freeze_A": False,
        "all_test": False,
        "real_replay": False,
        "balance_ft": False,
        "balance_epochs": 0,
    }
    return types.SimpleNamespace(**{**base, **options})


def suite_logit_scale() -> torch.Tensor:
    from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip

    return create_clip(BackboneSpec(TINY_MODEL, "synthetic")).model.logit_scale.detach().clone()
