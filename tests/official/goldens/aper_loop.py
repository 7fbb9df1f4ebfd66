"""APER-Adapter's training loop against the official one (issue 52): ``Learner.incremental_train``
of zhoudw-zdw/RevisitingCIL's ``models/aper_adapter.py`` run as is for two tasks (task 1: the SGD
adaptation of the adapters and the cosine head, ``construct_dual_branch_network``, ``replace_fc``;
task 2: ``update_fc`` and ``replace_fc``, no training), beside ``strategies/methods/aper_adapter.py`` through
``CLIPStrategy``'s own loop (``tests/official/test_aper_adapter_loop.py``).

The official ViT is timm's; here both sides run the suite's tiny CLIP with the suite's parallel
adapters (equal to the official ``Adapter`` in its ``Block`` by ``aper_adapter.adapter``), frozen
as the official ViT freezes all but its adapters. Dropout is 0 on both sides (its masks are
compared, given, by ``aper_adapter.adapter``); everything else is the recipe (SGD, momentum 0.9,
lr 0.01, wd 5e-4 on every parameter, cosine per epoch down to min_lr 0, plain CE), over 3 epochs of
the same 5 batches so that the per-epoch schedule steps twice.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tests.official.goldens import component
from tests.official.goldens import loop as shared
from tests.official.goldens.golden import Golden
from tests.official.goldens.revisitingcil_repo import OFFICIAL, _cuda_is_cpu, _official

SEED, TASKS, N_TEST = shared.SEED, shared.TASKS, shared.N_TEST  # the loops' common split
STEPS = 5  # batches a task
BATCH = 6
EPOCHS = 3
CONVNET = "pretrained_vit_b16_224_in21k_adapter"


def randn32(*size: int, generator: torch.Generator) -> torch.Tensor:
    """Standard normal float32 draws in float64: the fixture keeps them in float32 exactly."""
    return torch.randn(*size, generator=generator, dtype=torch.float32).double()


def suite_strategy(**changes):
    """The suite's APER on the tiny CLIP with the loop's options (``changes`` on top)."""
    from strategies.methods.aper_adapter import AperAdapter, AperConfig

    config = AperConfig(epochs=EPOCHS, batch_size=BATCH, adapter_dropout=0.0, **changes)
    torch.manual_seed(SEED)  # the adapters' initial values, drawn in float64 wherever it is called
    with shared.default_float64():
        return shared.tiny_clip_strategy(AperAdapter, config, float64=True)


def trained(backbone: nn.Module, head) -> dict[str, torch.Tensor]:
    """What trains in task 1, by the suite's names: the adapters and the head's weight and sigma."""
    named = {f"backbone.{n}": p for n, p in backbone.named_parameters() if p.requires_grad}
    return {**named, "head.weight": head.weight, "head.sigma": head.sigma}


class _Visual(nn.Module):
    """A convnet of the official nets: the suite's visual tower with (or without) its adapters."""

    def __init__(self, backbone: nn.Module, adapted: bool) -> None:
        super().__init__()
        self.backbone, self.adapted, self.out_dim = backbone, adapted, backbone.embed_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.adapted:
            return self.backbone.encode_image(x, normalize=False)
        with self.backbone.mlp_adapters(enabled=False):
            return self.backbone.encode_image(x, normalize=False)


class _Dataset(list):
    """The official loaders' stand-in: a list of (index, images, labels) batches with ``labels``."""

    def __init__(self, batches, labels) -> None:
        super().__init__(batches)
        self.labels = labels


@component("aper_adapter.loop", OFFICIAL)
def loop(checkout: Path) -> Golden:
    with shared.default_float64():  # both sides in float64 (torch's default while they run)
        return _official_loop(checkout)


def _official_loop(checkout: Path) -> Golden:
    strategy = suite_strategy()
    backbone = strategy.backbone
    size = backbone.image_size
    g = torch.Generator().manual_seed(SEED)
    tensors: dict[str, torch.Tensor] = {}
    for t, classes in enumerate(TASKS):  # every class in every task's batches
        labels = torch.tensor(classes).repeat(STEPS * BATCH // len(classes))
        labels = labels[torch.randperm(len(labels), generator=g)]
        for s in range(STEPS):
            tensors[f"input.task{t}.x{s}"] = randn32(BATCH, 3, size, size, generator=g)
            tensors[f"input.task{t}.y{s}"] = labels[s * BATCH : (s + 1) * BATCH]
    tensors["input.test_x"] = randn32(N_TEST, 3, size, size, generator=g)
    from strategies.methods.aper_adapter import CosineHead

    head = CosineHead(backbone.embed_dim, len(TASKS[0]))  # the suite's draw; copied into the official fc
    tensors["param.head.weight"] = head.weight.detach().clone()
    # The official nets run the generator's own backbone (a deep copy would keep forward hooks that
    # point at the original's adapters); its pretrained branch is the same tower, adapters off.
    official_backbone = pretrained = backbone
    initial = {n: p.detach().clone() for n, p in trained(backbone, head).items()}

    losses: list[float] = []
    record = shared.StepRecord(lambda: trained(official_backbone, live.fc), initial)
    live = SimpleNamespace(fc=None)

    def cross_entropy(*args, **kwargs):
        loss = F.cross_entropy(*args, **kwargs)
        losses.append(float(loss))
        return loss

    def step_hook(optimizer):
        record.step(losses[-1], [group["lr"] for group in optimizer.param_groups])

    def loader(t: int, test: bool = False) -> _Dataset:
        if test:
            return _Dataset(
                [(None, shared.on_host(tensors["input.test_x"]), torch.zeros(N_TEST, dtype=torch.long))], None
            )
        batches = [
            (None, shared.on_host(tensors[f"input.task{t}.x{s}"]), tensors[f"input.task{t}.y{s}"])
            for s in range(STEPS)
        ]
        return _Dataset(batches, torch.cat([b[2] for b in batches]).numpy())

    def get_dataset(indices, source, mode):
        t = next(i for i, c in enumerate(TASKS) if c[0] == int(indices[0]))
        return loader(t, test=source == "test")

    manager = SimpleNamespace(get_task_size=lambda t: len(TASKS[t]), get_dataset=get_dataset)
    # exps/aper_adapter/cifar224_5_5_vit-b_adapter.json, at the loop's sizes
    args = {
        "convnet_type": CONVNET, "init_cls": len(TASKS[0]), "memory_size": 0, "device": ["cpu"],
        "batch_size": BATCH, "init_lr": strategy.cfg.lr, "weight_decay": strategy.cfg.weight_decay,
        "min_lr": 0, "optimizer": "sgd", "tuned_epoch": EPOCHS,
    }  # fmt: skip
    with (
        _official(checkout) as load,
        _cuda_is_cpu(),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        load("convs/linears.py", "convs.linears")
        inc_net = load("utils/inc_net.py", "utils.inc_net")

        def get_convnet(a, pretrained_=False):
            if "adapter" not in a["convnet_type"]:
                return _Visual(pretrained, False)
            for name, p in official_backbone.named_parameters():  # the official ViT's rule: all but
                p.requires_grad = "mlp_adapter_modules" in name  # the adapters (not in the checkpoint)
            return _Visual(official_backbone, True)

        inc_net.get_convnet = get_convnet
        module = load("models/aper_adapter.py", "models.aper_adapter")
        module.DataLoader = lambda dataset, **kwargs: dataset  # the fixture's batches, in order
        module.F = SimpleNamespace(cross_entropy=cross_entropy)  # recorded, unchanged
        learner = module.Learner(args)
        update_fc = learner._network.update_fc

        def update_and_copy(n):  # task 1's fresh head takes the suite's initial values
            update_fc(n)
            with torch.no_grad():
                learner._network.fc.weight.copy_(tensors["param.head.weight"])
            live.fc = learner._network.fc

        learner._network.update_fc = update_and_copy
        with shared.on_every_optimizer_step(step_hook):
            for t in range(len(TASKS)):
                learner.incremental_train(manager)
                learner.after_task()
                learner._network.eval()
                with torch.no_grad():
                    tensors[f"output.task{t}.scores"] = learner._network(tensors["input.test_x"])["logits"]
    tensors.update(record.tensors("output.task0."))
    tensors["output.prototypes"] = learner._network.fc.weight.detach().clone()
    assert np.array_equal(np.unique(tensors["input.task1.y0"].numpy()), np.unique(TASKS[1]))
    return Golden(
        component="aper_adapter.loop",
        official=OFFICIAL,
        file="models/aper_adapter.py",
        function=(
            "Learner(args).incremental_train(data_manager) and after_task for 2 tasks: _train "
            "(SGD, CosineAnnealingLR per epoch, _init_train), construct_dual_branch_network, replace_fc; "
            "MultiBranchCosineIncrementalNet (utils/inc_net.py) scoring the test images after each task"
        ),
        loading=(
            "convs/linears.py, utils/inc_net.py, models/aper_adapter.py, models/base.py imported as is "
            "(timm stubbed: the official ViT is not built); utils.inc_net.get_convnet returns the suite's "
            "tiny CLIP visual tower with its adapters (convnet_type *_adapter; all but the adapters "
            "frozen by the rule of convs/vision_transformer_adapter.py: trainable = missing from the "
            "checkpoint) or the same tower with its adapters off (the pretrained branch); "
            "models.aper_adapter.DataLoader returns the fixture's batches in order; "
            "models.aper_adapter.F.cross_entropy records the loss; task 1's fresh CosineLinear takes "
            "the suite's initial head (its draw is compared by aper_adapter.head); .cuda() stays on the "
            "CPU; prints silenced"
        ),
        seed=SEED,
        sizes={
            "tasks": len(TASKS),
            "steps": STEPS * EPOCHS,
            "epochs": EPOCHS,
            "batch": BATCH,
            "test_images": N_TEST,
        },
        tensors=tensors,
        notes=(
            "output.task0.step{s} (s = 0..14: 3 epochs of the same 5 batches): the CE loss, the lr of the "
            "one param group as the step used it, and the fingerprint (loop.py) of each adapter tensor "
            "and of the head's weight and sigma after the step (suite names). output.task{t}.scores: "
            "the dual-branch prototype logits after task t; output.prototypes: the rows after task 2. "
            "Both sides in float64 (torch's default dtype while they run; the inputs float32 draws); "
            "param.* and outputs stored in float64."
        ),
        float64=("output.", "param."),
    )
