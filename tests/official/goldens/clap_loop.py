"""Loop golden of CLAP4CLIP (srvCodes/clap4clip): the official ``ClClipVariational.fit`` over two
tasks (its SGD over the VGA and the current task's encoders, ``build_cosine_scheduler`` with 30 %
warm-up stepped per iteration, CE + KL + LASP), ``post_training`` and ``inference`` after each task,
driven as ``main_incremental_submit.py`` drives it in the replay-free setting the suite runs (D5: no
memory, so no ``finetuning`` pass, which needs the memory loader), beside the suite's ``CLAP``
trained by its own ``learn`` (``suite_loop.run_suite_loop``).

Features stand in for images on both sides, as in ``clap4clip_official``: the official CLIP is
``_FeatureCLIP`` (templates from the fixture, the visual tower the identity), the suite's
``encode_image`` normalises the given features. The official ``Normal.rsample`` takes its
standard-normal draws from the fixture's noise, in the order the official code asks for them; the
suite replays the same draws (tests/official/test_clap_loop.py). Both sides start from the suite's
tensors: the VGA and task 0's encoders copied in after the official ``init_model`` of task 0, task
1's encoders (language-aware weights, the suite's random biases) after that of task 1. Options that
restore the official behaviour on the suite side: ``vga_context = "batch"`` and ``eval_noise =
"batch"`` at evaluation (D4; training attends over the batch by default), VGA dropout 0 on both.
Both sides run in float64: in float32, the KL weight 1 % off moved the loss only 1.9 times its
tolerance above the rounding two CPUs carry differently.
"""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F
from torch import nn

from tests.official.goldens import component
from tests.official.goldens.clap4clip_cases import (
    DIM,
    Case,
    official_name,
    suite_clap,
    suite_name,
    suite_parameters,
)
from tests.official.goldens.clap4clip_official import LOADING, official_variational
from tests.official.goldens.clap4clip_repo import OFFICIAL
from tests.official.goldens.golden import Golden
from tests.official.goldens.loop import float64_golden

CASE = Case(seed=71, task_sizes=(2, 2), batch=4, samples=3, templates=4)
EPOCHS, TEST = 5, 5  # the official 5 epochs, one batch each: 5 steps a task, 30 % (1 step) warm-up


def tasks() -> list[list[int]]:
    first = CASE.task_sizes[0]
    return [list(range(first)), list(range(first, CASE.classes))]


def noise_shapes() -> list[tuple[int, int, int]]:
    """The official ``rsample`` draws in order: per task t, per step, one per task 0..t; then one
    per task 0..t for the test batch."""
    sizes = CASE.task_sizes
    out = []
    for t in range(len(sizes)):
        out += [(CASE.samples, sizes[i], DIM) for _ in range(EPOCHS) for i in range(t + 1)]
        out += [(CASE.samples, sizes[i], DIM) for i in range(t + 1)]
    return out


def loop_inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(CASE.seed)
    centre = torch.randn(CASE.classes, 1, DIM, generator=g)
    out = {
        "input.templates": F.normalize(
            centre + 0.4 * torch.randn(CASE.classes, CASE.templates, DIM, generator=g), dim=-1
        ),
        "input.test.images": torch.randn(TEST, DIM, generator=g),
    }
    for t, classes in enumerate(tasks()):
        for e in range(EPOCHS):
            # images near their class's direction, so that the CE has something to learn
            labels = torch.tensor(classes)[torch.randint(len(classes), (CASE.batch,), generator=g)]
            images = centre[labels, 0] + torch.randn(CASE.batch, DIM, generator=g)
            out[f"input.task{t}.epoch{e}.images"], out[f"input.task{t}.epoch{e}.labels"] = images, labels
    for k, shape in enumerate(noise_shapes()):
        out[f"input.noise.{k}"] = torch.randn(*shape, generator=g)
    return out


def start_parameters(templates: torch.Tensor) -> dict[str, torch.Tensor]:
    """The suite's VGA and encoders as set up at each task (``suite_clap``: both tasks' setup_task)."""
    strategy = suite_clap(CASE, templates, seed=CASE.seed)
    return {f"param.{k}": v.detach().clone() for k, v in suite_parameters(strategy).items()}


class _EpochLoader:
    """``fit``'s train loader: epoch e's batch ``(x, y, index)`` on its e-th pass; its dataset is as
    large as a batch of 32, so ``fit`` keeps its learning rate."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.batches, self.passes = batches, 0
        self.dataset = range(32)

    def __len__(self) -> int:
        return 1

    def __iter__(self):
        x, y = self.batches[self.passes]
        self.passes += 1
        return iter([(x, y, torch.arange(len(y)))])


@component("clap.loop", OFFICIAL)
def clap_loop(checkout: Path) -> Golden:
    return float64_golden(loop_inputs(), lambda inputs: _official_loop(checkout, inputs))


def _official_loop(checkout: Path, inputs: dict[str, torch.Tensor]) -> Golden:
    params = start_parameters(inputs["input.templates"])
    strategy = suite_clap(CASE, inputs["input.templates"], seed=CASE.seed)
    logit_scale = float(strategy.backbone.logit_scale)
    names = [f"class_{c}" for c in range(CASE.classes)]
    template_strings = [f"template {m} of a {{}}." for m in range(CASE.templates)]
    queue = [inputs[f"input.noise.{k}"] for k in range(len(noise_shapes()))]
    samples: list[torch.Tensor] = []
    out: dict[str, torch.Tensor] = {}
    step = [0]
    losses: list[torch.Tensor] = []
    features = inputs["input.templates"].reshape(-1, DIM)
    with official_variational(
        checkout, CASE.samples, names, template_strings, features, logit_scale, queue, samples
    ) as (args, official):
        assert official.epochs == EPOCHS
        init_model = official.init_model

        def traced_init_model(class_names, per_epoch_steps, prompt_templates=None):
            init_model(class_names, per_epoch_steps, prompt_templates)
            model = official.model
            if args.sess == 0:
                for module in official.vga.modules():  # dropout off (fit keeps the VGA in train mode)
                    if isinstance(module, nn.Dropout):
                        module.p = 0.0
                    if isinstance(module, nn.MultiheadAttention):
                        module.dropout = 0.0
            mine = [n for n in params if n.startswith(f"param.encoders.{args.sess}.")]
            if args.sess == 0:
                mine += [n for n in params if n.startswith("param.vga.")]
            named = dict(model.named_parameters())
            with torch.no_grad():
                for name in mine:
                    named[official_name(name.removeprefix("param."))].copy_(params[name])
            optimizer_step = official.optimizer.step

            def recorded_step(*a, **k):
                lrs = [group["lr"] for group in official.optimizer.param_groups]
                result = optimizer_step(*a, **k)
                key = f"output.step{step[0]}"
                out[f"{key}.lr"] = torch.tensor(lrs, dtype=torch.float64)
                out[f"{key}.loss"] = losses[-1].reshape(())
                for n, p in model.named_parameters():
                    if "vga" in n or "adapter" in n:
                        out[f"{key}.{suite_name(n)}"] = p.detach().clone()
                step[0] += 1
                return result

            official.optimizer.step = recorded_step

        official.init_model = traced_init_model
        backward = torch.Tensor.backward

        def traced_backward(tensor, *a, **k):
            losses.append(tensor.detach().clone())
            return backward(tensor, *a, **k)

        for t, classes in enumerate(tasks()):
            args.sess = t
            batches = [
                (inputs[f"input.task{t}.epoch{e}.images"], inputs[f"input.task{t}.epoch{e}.labels"])
                for e in range(EPOCHS)
            ]
            data = {
                "train_loader": _EpochLoader(batches),
                "class_names": [names[c] for c in classes],
                "prompt_templates": template_strings,
            }
            with mock.patch.object(torch.Tensor, "backward", traced_backward):
                official.fit(data)
            official.post_training(finalize=False)
            official.post_training(finalize=True)  # no finetuning: no memory (D5)
            labels = torch.zeros(TEST, dtype=torch.long)
            logits, _ = official.inference(inputs["input.test.images"], labels, None, None)
            out[f"output.task{t}.scores"] = logits.mean(0)  # [B, seen]: the mean over the R samples
    if queue or step[0] != len(tasks()) * EPOCHS:
        raise RuntimeError(f"{len(queue)} noise draws unused, {step[0]} steps")
    return Golden(
        component="clap.loop",
        official=OFFICIAL,
        file="classifier/continual_clip_variational.py, classifier/utils.py, main_incremental_submit.py",
        function=(
            "ClClipVariational.fit, post_training, inference over two tasks "
            "(build_optimizer, build_cosine_scheduler)"
        ),
        loading=LOADING.replace("--forward-times set to the case's R", "--forward-times set to 3"),
        seed=CASE.seed,
        sizes={
            "tasks": 2,
            "epochs": EPOCHS,
            "steps_per_epoch": 1,
            "batch": CASE.batch,
            "samples": CASE.samples,
            "templates": CASE.templates,
            "task_1_classes": CASE.task_sizes[0],
            "task_2_classes": CASE.task_sizes[1],
            "test": TEST,
        },
        tensors={**inputs, **params, **out},
        notes=(
            f"Width {DIM}, classes {tasks()}, R = {CASE.samples}, {CASE.templates} templates. param.*: the "
            "suite's CLAP after setup_task of both tasks (suite_clap); the VGA and encoders.0 copied into "
            "the official model after task 0's init_model, encoders.1 after task 1's. Per task: the "
            "official fit on a loader whose pass e yields input.task{t}.epoch{e}.* (one batch of 4 image "
            "features an epoch, 5 epochs: 5 SGD steps, lr 1.6e-3 with int(0.3 x 5) = 1 warm-up step), "
            "post_training, no finetuning (replay-free, D5), inference on input.test.images (the batch "
            "as the VGA's context). output.step{n}.*: after the n-th optimizer.step of the stream, the "
            "loss fit backpropagated, the lr of each group as the step used it, every VGA and encoder "
            "tensor (suite names). output.task{t}.scores: the mean over R of inference's logits. "
            "input.noise.{k}: the k-th standard-normal draw of Normal.rsample, [R, C_i, d]: per step one "
            "per seen task, then one per seen task for the test batch. Both sides in float64 (torch's "
            "default dtype while they run; the float32 inputs read in float64); param.* and outputs "
            "stored in float64."
        ),
        float64=("output.", "param."),
    )
