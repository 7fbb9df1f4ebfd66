"""MG-CLIP's training loop against the official one (issue 52): ``run_class_incremental`` of
linlany/MindtheGap's ``main.py`` run as is for two tasks (the LoRA stage: Adam, per-epoch cosine,
CE on task 1 and ``intra_cls`` over the current classes after; the visual stage: class means as
the new rows of ``VisionClassifier``, Adam with a per-iteration cosine; the fused evaluation),
beside ``strategies/methods/mg_clip.py`` through ``CLIPStrategy``'s own loop
(``tests/official/test_mg_clip_loop.py``).

The official CLIP is OpenAI's with ``loraclip``'s LoRA; here its model is the suite's tiny CLIP
with the suite's LoRA on k and v of both towers (equal to loraclip's by ``mg_clip.lora``), driven
by the official ``forward_clip`` and ``ClassIncrementalCLIP``. The recipe's values but for the
sizes: 2 epochs of 5 batches a task (so the per-epoch cosine steps), visual stage 3 epochs of 2
batches of 10. Both sides run in float64 (torch's default dtype while they run, the tiny CLIP and
its LoRA, the batches): in float32 two CPUs carried rounding apart by more than the tolerances
measured on one.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import types
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from tests.official.goldens import component
from tests.official.goldens import loop as shared
from tests.official.goldens.golden import Golden, official_import_path, stub_module
from tests.official.goldens.mindthegap_repo import MINDTHEGAP

SEED, TASKS, N_TEST = shared.SEED, shared.TASKS, shared.N_TEST  # the loops' common split
STEPS = 5  # batches an epoch
BATCH = 4
EPOCHS = 2
VISUAL_BATCH = 10


def suite_strategy(**changes):
    """The suite's MG-CLIP on the tiny CLIP with the loop's sizes (``changes`` on top)."""
    from strategies.methods.mg_clip import MGCLIP, MGCLIPConfig

    config = MGCLIPConfig(epochs=EPOCHS, batch_size=BATCH, visual_batch_size=VISUAL_BATCH, **changes)
    return shared.tiny_clip_strategy(MGCLIP, config, float64=True)


def lora(backbone: nn.Module) -> dict[str, torch.Tensor]:
    """The LoRA tensors of both towers, by the suite's names."""
    return {f"backbone.{n}": p for n, p in backbone.named_parameters() if "lora_" in n}


def visual_batches(tensors, task: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The visual stage's batches: the task's training images in order, ``VISUAL_BATCH`` at a time."""
    x = torch.cat([tensors[f"input.task{task}.x{s}"] for s in range(STEPS)])
    y = torch.cat([tensors[f"input.task{task}.y{s}"] for s in range(STEPS)])
    return [(x[i : i + VISUAL_BATCH], y[i : i + VISUAL_BATCH]) for i in range(0, len(y), VISUAL_BATCH)]


class _CLIP(nn.Module):
    """``ClassIncrementalCLIP.model``: the suite's backbone with its LoRA, as OpenAI's CLIP's
    ``encode_image``, ``encode_text`` and ``logit_scale`` (its forward is the official forward_clip)."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.logit_scale = backbone.model.logit_scale

    def encode_image(self, image):
        return self.backbone.encode_image(image, normalize=False)

    def encode_text(self, tokens):
        return self.backbone.encode_text(tokens, normalize=False)


class _Logger:
    """continuum's metrics Logger, unused here: every number is read from the model."""

    accuracy = average_incremental_accuracy = forgetting = backward_transfer = forward_transfer = 0.0
    accuracy_per_task: list[float] = []

    def __init__(self, *args, **kwargs) -> None:
        pass

    def add(self, *args, **kwargs) -> None:
        pass

    def end_task(self) -> None:
        pass


@component("mg_clip.loop", MINDTHEGAP)
def loop(checkout: Path) -> Golden:
    strategy = suite_strategy()
    stored = shared.loop_inputs(strategy.backbone.image_size, STEPS, BATCH)  # float32, as kept
    return shared.float64_golden(stored, lambda tensors: _official_loop(checkout, strategy, tensors))


def _official_loop(checkout: Path, strategy, tensors: dict[str, torch.Tensor]) -> Golden:
    backbone = strategy.backbone
    strategy.current_classes = list(TASKS[0])
    torch.manual_seed(SEED)
    strategy.setup_task(0, list(TASKS[0]))  # the suite's LoRA (A xavier, B 0), active and trainable
    initial = {n: p.detach().clone() for n, p in lora(backbone).items()}
    tensors.update({f"param.{n}": p for n, p in initial.items()})
    clip_model = _CLIP(backbone)
    lora_records = [shared.StepRecord(lambda: lora(backbone), initial) for _ in TASKS]
    live: dict = {"task": 0, "agent": None}
    visual_records = [
        shared.StepRecord(
            lambda: {"classifier.rows": live["agent"].fc[live["bias"] :]},
            {"classifier.rows": torch.zeros(())},
        )
        for _ in TASKS
    ]
    losses: list[float] = []

    def step_hook(optimizer):
        lrs = [group["lr"] for group in optimizer.param_groups]
        agent = live["agent"] is not None and any(
            p is live["agent"].fc for p in optimizer.param_groups[0]["params"]
        )
        (visual_records if agent else lora_records)[live["task"]].step(losses[-1], lrs)

    def data_loader(dataset, batch_size=None, shuffle=False, num_workers=0):
        kind, t = dataset
        if kind == "eval":  # the tasks so far: the fixed test images, labels unused
            return [
                (
                    shared.on_host(tensors["input.test_x"]),
                    torch.zeros(N_TEST, dtype=torch.long),
                    torch.zeros(N_TEST),
                )
            ]
        pairs = (
            visual_batches(tensors, t)
            if batch_size == VISUAL_BATCH
            else [(tensors[f"input.task{t}.x{s}"], tensors[f"input.task{t}.y{s}"]) for s in range(STEPS)]
        )
        return [(shared.on_host(x), shared.on_host(y), torch.zeros_like(y)) for x, y in pairs]

    class _Split(list):
        def __init__(self, kind: str) -> None:
            super().__init__([None] * len(TASKS))
            self.kind = kind

        def __getitem__(self, key):
            return (self.kind, key if isinstance(key, int) else key.stop)

    cfg = SimpleNamespace(
        class_order="order.txt", workdir=".", prompt_template=strategy.cfg.prompt_template, batch_size=N_TEST,
        increment=len(TASKS[1]), initial_increment=len(TASKS[0]), task_num=len(TASKS), epochs=EPOCHS,
        train_batch_size=BATCH, num_workers=0, lr=strategy.cfg.lr, reset=False, only_reset_B=False,
        freeze_A=False, all_test=False, visual_agent=True, visual_agent_lr=strategy.cfg.visual_lr,
        visual_agent_batch_size=VISUAL_BATCH, visual_agent_epochs=strategy.cfg.visual_epochs,
        real_replay=False, balance_ft=False, balance_epochs=0, log_path="metric.json",
        model_name="ViT-B/16",
    )  # fmt: skip
    stubs = {
        "hydra": stub_module("hydra", main=lambda **kw: lambda f: f),
        "omegaconf": stub_module("omegaconf", DictConfig=dict, OmegaConf=None),
        "continuum": stub_module("continuum", __path__=[], rehearsal=None),
        "continuum.metrics": stub_module("continuum.metrics", Logger=_Logger),
        "sklearn": stub_module("sklearn", __path__=[]),
        "sklearn.cluster": stub_module("sklearn.cluster", KMeans=None),
        "continual_clip.datasets": stub_module("continual_clip.datasets", build_cl_scenarios=None),
        "clip": stub_module("clip", __path__=[], tokenize=backbone.tokenize),  # the same BPE tokens
        "clip.model": stub_module("clip.model", VisionTransformer=None),
        "loraclip": stub_module("loraclip", __path__=[], lora_clip=None),
    }
    module_cuda, tensor_cuda = nn.Module.cuda, torch.Tensor.cuda
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        old = Path.cwd()
        os.chdir(tmp)  # ori_params.pth, trainable_params.pth, metric.json, final_model.pth
        stack.callback(os.chdir, old)
        nn.Module.cuda = lambda self, *a, **k: self
        torch.Tensor.cuda = lambda self, *a, **k: self
        stack.callback(setattr, nn.Module, "cuda", module_cuda)
        stack.callback(setattr, torch.Tensor, "cuda", tensor_cuda)
        stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
        load = stack.enter_context(official_import_path(checkout, stubs))
        utils = load("continual_clip/utils.py", "continual_clip.utils")
        models = load("continual_clip/models.py", "continual_clip.models")
        main = load("main.py", "mindthegap_main")
        utils.get_class_order = lambda path: [c for t in TASKS for c in t]
        learner = models.ClassIncrementalCLIP.__new__(models.ClassIncrementalCLIP)
        nn.Module.__init__(learner)  # __init__ loads OpenAI's CLIP through loraclip: set by hand
        learner.cfg, learner.prompt_template, learner.device = cfg, cfg.prompt_template, "cpu"
        learner.model, learner.transforms = clip_model, None
        learner.model.forward = types.MethodType(models.forward_clip, learner.model)  # as its __init__
        order = SimpleNamespace(
            class_order=[c for t in TASKS for c in t],
            initial_increment=cfg.initial_increment,
            increment=cfg.increment,
        )
        learner.class_ids_per_task = list(models.get_class_ids_per_task(order))
        learner.current_class_names, learner.text_tokens, learner.current_task = [], None, -1
        learner.only_reset_B = learner.freeze_A = False
        names = list(strategy.class_names)
        main.load_model = lambda cfg, device: learner
        main.build_cl_scenarios = lambda cfg, is_train, transforms: (
            _Split("train" if is_train else "eval"),
            names,
        )
        main.DataLoader = data_loader
        backward = torch.Tensor.backward

        def recorded_backward(self, *args, **kwargs):  # every training step's loss, unchanged
            losses.append(float(self.detach()))
            return backward(self, *args, **kwargs)

        torch.Tensor.backward = recorded_backward
        stack.callback(setattr, torch.Tensor, "backward", backward)
        softmaxes: list[torch.Tensor] = []

        def softmax(x, dim=None, **kwargs):  # the evaluation's two softmaxes, kept
            out = torch.nn.functional.softmax(x, dim=dim, **kwargs)
            softmaxes.append(out.detach().clone())
            return out

        main.F = SimpleNamespace(softmax=softmax, cross_entropy=torch.nn.functional.cross_entropy)
        agent_cls = main.VisionClassifier

        class Agent(agent_cls):  # records itself and the rows it adds, nothing else changed
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                live["agent"] = self

            def set_weight(self, weight):
                live["bias"], live["init"] = 0, weight.detach().clone()
                super().set_weight(weight)

            def add_weight(self, weight):
                live["bias"], live["init"] = self.fc.shape[0], weight.detach().clone()
                super().add_weight(weight)

        main.VisionClassifier = Agent
        adapt = learner.adaptation

        def adaptation(task_id, reset=False):
            live["task"] = task_id
            adapt(task_id, reset)

        learner.adaptation = adaptation
        with shared.on_every_optimizer_step(step_hook):
            main.run_class_incremental(cfg, "cpu")
    assert len(softmaxes) == 2 * len(TASKS)  # per task: softmax(p_text), softmax(p_vis)
    for t in range(len(TASKS)):
        text, vis = softmaxes[2 * t], softmaxes[2 * t + 1]
        tensors[f"output.task{t}.scores"] = (1 * text + 4 * vis) / (1 + 4)  # main.py's a = 1, b = 4
        tensors.update(lora_records[t].tensors(f"output.task{t}.lora."))
        tensors.update(visual_records[t].tensors(f"output.task{t}.visual."))
    return Golden(
        component="mg_clip.loop",
        official=MINDTHEGAP,
        file="main.py",
        function="run_class_incremental(cfg, device) for 2 tasks",
        loading=(
            "main.py, continual_clip/utils.py and continual_clip/models.py imported as is; stubbed: hydra "
            "(main = identity decorator), omegaconf (type names), continuum.metrics.Logger (no metrics: "
            "the numbers are read from the model), continuum.rehearsal, sklearn.cluster, "
            "continual_clip.datasets, loraclip and clip.model (unused: the model is given), clip.tokenize "
            "(the suite's open_clip tokenizer, the same BPE tokens); ClassIncrementalCLIP.__init__ "
            "skipped (it loads OpenAI's CLIP through loraclip): its attributes set by hand, its model the "
            "suite's tiny CLIP with the suite's LoRA (mg_visual, mg_text: only they require grad, as "
            "loraclip marks them) behind encode_image, encode_text and logit_scale, forward = the "
            "official forward_clip; main.load_model, main.build_cl_scenarios and main.DataLoader return "
            "that model and the fixture's batches in order (train batches of 4, visual stage batches of "
            "10, the test images); VisionClassifier subclassed only to see its rows; Tensor.backward "
            "records each loss and main.F.softmax the evaluation's two softmaxes, both unchanged; "
            ".cuda() stays on the CPU; the .pth and metric files go to a temporary cwd; prints silenced"
        ),
        seed=SEED,
        sizes={"tasks": len(TASKS), "steps": EPOCHS * STEPS, "visual_steps": 6, "test_images": N_TEST},
        tensors=tensors,
        notes=(
            f"cfg: configs/class/cifar100_10-10.yaml (Adam lr 1e-3, CosineAnnealingLR per epoch to 0.01 lr, "
            f"visual stage Adam 5e-4, per-iteration cosine, 3 epochs, fusion a = 1, b = 4) at the loop's "
            f"sizes ({EPOCHS} epochs of {STEPS} batches of {BATCH}, visual batches of {VISUAL_BATCH}). "
            "param.*: the suite's initial LoRA (A xavier, B 0) that both sides start from. "
            "output.task{t}.lora.step{s}: the loss (CE on task 1, intra_cls over the current classes "
            "after), the lr, the fingerprint (loop.py) of each LoRA tensor's change after the step. "
            "output.task{t}.visual.step{s}: the loss, the lr and the fingerprint of the new rows "
            "themselves (not their change: they start from class means). output.task{t}.scores: "
            "(softmax(softmax(text logits)) + 4 softmax(visual cosines)) / 5 over the seen classes "
            "on input.test_x, from the two softmaxes main.py computes. Both sides in float64 (torch's "
            "default dtype while they run); param.* and outputs stored in float64."
        ),
        float64=("output.", "param."),
    )
