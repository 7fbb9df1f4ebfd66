"""MoE-Adapters' training loop against the official one (issue 52): ``ClassIncremental.adaptation``
and ``train`` of JiazuoYu/MoE-Adapters4CL's ``cil/continual_clip/models.py`` run as is for two
tasks, beside ``strategies/methods/moe4cl.py`` through ``CLIPStrategy``'s own loop
(``tests/official/test_moe4cl_loop.py``).

The official CLIP is OpenAI's with the MoE adapters of ``cil/clip/model.py``; here its model is
the suite's tiny CLIP with the suite's experts and routers (equal to the official block by
``moe4cl.block`` and ``moe4cl.gates``), under the official parameter names (``adaptmlp_list``,
``router_list``, ``w_noise_list``) so that the official selection of what trains applies. The
recipe's values (AdamW, lr 1e-3, wd 0, the official hard-coded 30 warm-up steps, CE without label
smoothing) over 40 batches a task, CIFAR-100's (5,000 / 128): 30 steps in the warm-up and 10 of the
cosine, long enough for a weight decay of 1e-4 to show on any CPU. The gate noise and dropout draw
from the global generator, seeded before each task on both sides, in the same order (image tower,
then text tower, as the official CLIP's forward). Both sides run in float64 (the tiny CLIP, its
experts and routers, the batches): 40 float32 Adam steps carry rounding to differences of 2.5e-4
between CPUs (an AMD EPYC and an Intel Xeon), more than a weight decay of 1e-4 moves; in float64 they
are 3e-14 apart.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from tests.official.goldens import component
from tests.official.goldens import loop as shared
from tests.official.goldens.golden import Golden, official_import_path, stub_module
from tests.official.goldens.moe_adapters_repo import OFFICIAL

SEED, TASKS, N_TEST = shared.SEED, shared.TASKS, shared.N_TEST  # the loops' common split
STEPS = 40  # batches a task; the official loop takes one more iteration (batch 0 again)
BATCH = 4
# (warm-up, batches a task) of the official schedule recorded over its num_batches + 1 iterations:
# CIFAR-100 (5,000 / 128), ImageNet-R (2,400 / 128), ImageNet-100 (13,000 / 128), the miniature of
# smoke-baselines (500 / 128, its warm-up a tenth)
SCHEDULES = ((30, 40), (30, 19), (30, 102), (3, 4))


def suite_strategy(**changes):
    """The suite's MOE4CL on the tiny CLIP with the recipe (``changes`` on top), in float64."""
    from strategies.methods.moe4cl import MOE4CL, MOE4CLConfig

    config = MOE4CLConfig(batch_size=BATCH, **changes)
    torch.manual_seed(SEED)  # the experts' and routers' initial values
    return shared.tiny_clip_strategy(MOE4CL, config, float64=True)


def trained(backbone: nn.Module) -> dict[str, torch.Tensor]:
    """The experts and routers of both towers, by the suite's names."""
    return {f"backbone.{n}": p for n, p in backbone.named_parameters() if "mlp_adapter_modules" in n}


def official_name(name: str) -> str:
    """A suite parameter's name as the official model spells its counterpart (moe4cl.block's map)."""
    name = re.sub(r"experts\.(\d+)", r"adaptmlp_list.\1", name)
    return name.replace("router.w_gate", "router_list.0").replace("router.w_noise", "w_noise_list.0")


class _OfficialModel(nn.Module):
    """The model of the official ``ClassIncremental``: the suite's backbone, under official names,
    with the official CLIP's ``forward(image, text, taskid, is_train)``."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.logit_scale = backbone.model.logit_scale

    def named_parameters(self, *args, **kwargs):
        for name, p in self.backbone.named_parameters():
            yield official_name(name), p

    def forward(self, image, text, taskid, is_train):
        image = self.backbone.encode_image(image, normalize=True)  # image first, as CLIP.forward
        text = self.backbone.encode_text(text, normalize=True)
        logits = self.backbone.logit_scale * image @ text.T
        return logits, logits.T


class _Loader:
    """The official DataLoader's stand-in: the task's batches in order, fresh tensors each pass (the
    official loop shifts the targets in place)."""

    def __init__(self, batches) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        for x, y in self.batches:
            yield shared.on_host(x.double()), shared.on_host(y), torch.zeros_like(y)


@component("moe4cl.loop", OFFICIAL)
def loop(checkout: Path) -> Golden:
    strategy = suite_strategy()
    backbone = strategy.backbone
    tensors = shared.loop_inputs(backbone.image_size, STEPS, BATCH)
    initial = {n: p.detach().clone() for n, p in trained(backbone).items()}
    model = _OfficialModel(backbone)
    for p in backbone.parameters():
        p.requires_grad_(True)  # as the official model is built; its train() freezes all but the MoE
    records = [shared.StepRecord(lambda: trained(backbone), initial) for _ in TASKS]
    losses: list[float] = []
    live = {"task": 0}

    def cross_entropy(logits, targets, **kwargs):
        loss = torch.nn.functional.cross_entropy(logits, targets, **kwargs)
        losses.append(float(loss))
        return loss

    def step_hook(optimizer):
        records[live["task"]].step(losses[-1], [group["lr"] for group in optimizer.param_groups])

    def data_loader(dataset, **kwargs):
        t = dataset  # train_dataset[task_id:task_id + 1] below is the task index
        return _Loader(
            [(tensors[f"input.task{t}.x{s}"], tensors[f"input.task{t}.y{s}"]) for s in range(STEPS)]
        )

    class _TrainDataset:
        def __getitem__(self, key: slice) -> int:
            return key.start

    tokenize = backbone.tokenize  # open_clip's BPE: the official tokens (continual_clip.zero_shot)
    stubs = {
        "omegaconf": stub_module("omegaconf", DictConfig=dict, OmegaConf=SimpleNamespace()),
        "clip": stub_module("clip", __path__=[]),
        "clip.clip": stub_module("clip.clip", tokenize=tokenize),
        "clip.tokenizer": stub_module("clip.tokenizer", SimpleTokenizer=object),
        "continual_clip": stub_module("continual_clip", __path__=[str(checkout / "cil" / "continual_clip")]),
        "continual_clip.cc": stub_module("continual_clip.cc", conceptual_captions=None),
        "continual_clip.dynamic_dataset": stub_module("continual_clip.dynamic_dataset", DynamicDataset=None),
    }
    cfg = SimpleNamespace(
        lr=strategy.cfg.lr, weight_decay=strategy.cfg.weight_decay, batch_size=BATCH, ls=0.0,
        dataset="cifar100", increment=len(TASKS[0]), initial_increment=len(TASKS[0]), method="MoE-Adapters",
    )  # fmt: skip
    module_cuda = nn.Module.cuda
    nn.Module.cuda = lambda self, *a, **k: self
    try:
        with (
            official_import_path(checkout / "cil", stubs) as load,
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            utils = load("continual_clip/utils.py", "continual_clip.utils")
            for warmup, steps in SCHEDULES:  # the lr of each of the official steps + 1 iterations
                optimizer = torch.optim.AdamW([nn.Parameter(torch.zeros(1))], lr=strategy.cfg.lr)
                adjust, lrs = utils.cosine_lr(optimizer, strategy.cfg.lr, warmup, steps), []
                for iteration in range(steps + 1):
                    adjust(iteration)
                    lrs.append(optimizer.param_groups[0]["lr"])
                tensors[f"output.schedule.warmup{warmup}_steps{steps}"] = torch.tensor(
                    lrs, dtype=torch.float64
                )
            models = load("continual_clip/models.py", "continual_clip.models")
            models.DataLoader = data_loader
            models.F = SimpleNamespace(cross_entropy=cross_entropy)  # recorded, unchanged
            learner = models.ClassIncremental.__new__(models.ClassIncremental)
            nn.Module.__init__(learner)  # __init__ loads OpenAI's CLIP and the datasets: set by hand
            learner.prompt_template = strategy.cfg.prompt_template
            learner.device = "cpu"
            learner.model = model
            learner.classes_names = list(strategy.class_names)
            learner.class_ids_per_task = [list(c) for c in TASKS]
            learner.current_class_names = []
            with shared.on_every_optimizer_step(step_hook):
                for t in range(len(TASKS)):
                    live["task"] = t
                    torch.manual_seed(SEED + t)
                    learner.adaptation(t, cfg, _TrainDataset(), None)
                    learner.model.eval()
                    with torch.no_grad():
                        logits, _ = learner.model(
                            tensors["input.test_x"].double(), learner.text_tokens, 0, is_train=False
                        )
                    tensors[f"output.task{t}.scores"] = logits
                    tensors.update(records[t].tensors(f"output.task{t}."))
    finally:
        nn.Module.cuda = module_cuda
    return Golden(
        component="moe4cl.loop",
        official=OFFICIAL,
        file="cil/continual_clip/models.py",
        function="ClassIncremental.adaptation and ClassIncremental.train, 2 tasks; forward's logits at test",
        loading=(
            "cil/continual_clip/utils.py and models.py imported as is; stubbed: omegaconf (not "
            "installed; only type names used), clip.clip (tokenize: the suite's open_clip tokenizer, "
            "the same BPE tokens; load unused), clip.tokenizer, continual_clip.cc and "
            "continual_clip.dynamic_dataset (unused datasets); ClassIncremental.__init__ skipped (it "
            "loads OpenAI's CLIP and the datasets): its attributes set by hand, the model being the "
            "suite's tiny CLIP with its MoE adapters under the official parameter names (forward as "
            "the official CLIP.forward: image, then text, logit_scale.exp() * cosines), every "
            "parameter trainable until the official train() freezes all but adaptmlp/router/noise; "
            "models.DataLoader returns the fixture's batches in order (fresh tensors each pass); "
            "models.F.cross_entropy records the loss; nn.Module.cuda and the inputs' .cuda() stay "
            "on the CPU; prints silenced"
        ),
        seed=SEED,
        sizes={
            "tasks": len(TASKS),
            "batches": STEPS,
            "steps": STEPS + 1,
            "batch": BATCH,
            "test_images": N_TEST,
        },
        tensors=tensors,
        notes=(
            "The global generator is seeded with SEED + t before task t's adaptation (the gate noise "
            "and dropout draw from it). The official loop runs num_batches + 1 = 41 iterations a task, "
            "the last on batch 0 again (its loader restarts), at lr 0 (past the warm-up). "
            "output.task{t}.step{s}: the CE loss, "
            "the lr of the one param group as the step used it (cosine_lr with 30 warm-up steps sets "
            "it before the step), the fingerprint (loop.py) of every expert and router tensor of both "
            "towers after the step (suite names). output.task{t}.scores: the model's logits over the "
            "classes seen so far on input.test_x, in eval mode with the gate noise off (the suite's "
            "default, D4; the official noisy evaluation is compared by moe4cl.block). "
            "output.schedule.warmup{W}_steps{T}: the lr continual_clip/utils.py cosine_lr(optimizer, "
            "1e-3, W, T) sets at each of the loop's T + 1 iterations. The model and batches in float64 "
            "on both sides; the outputs stored in float64."
        ),
        float64=("output.",),
    )
