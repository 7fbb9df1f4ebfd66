"""MagMax's training loop against the official one (issue 52): ``finetune`` of
danielm1405/magmax's ``finetune_splitted.py`` run as is over two class-incremental splits of
sequential fine-tuning, then the official merge (``merge_max_abs`` and ``apply_to`` of
``src/merging/task_vectors.py``, as ``merge_splitted.py``'s ``evaluate_merged_fts`` applies them to
the splits so far), beside ``strategies/methods/magmax.py`` through ``CLIPStrategy``'s own training loop
(``tests/official/test_magmax_loop.py``).

Both sides start from the suite's tiny CLIP (shipped weights, attention split into q/k/v/out as
the suite builds it: AdamW is elementwise, so the split changes no step) and see the same seeded
batches in the same order. The loop's hyper-parameters are the recipe's (AdamW, wd 0.1, clipping
at 1.0, plain CE, warm-up then cosine per iteration, restarted per task) but for a larger learning
rate (1e-3, so that five steps move the weights far above float32 rounding) and a warm-up of 2
steps (so that the cosine branch runs within the task's 5 steps). Both sides run in float64 (the
tiny CLIP and the batches): in float32, the clipping norm's perturbation (x1.01) stood only 1.3 times
its tolerance above the rounding that two CPUs carry through Adam differently.
"""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

import open_clip
import torch

from tests.official.goldens import component
from tests.official.goldens import loop as shared
from tests.official.goldens.golden import Golden, official_import_path, stub_module
from tests.official.goldens.magmax_repo import MAGMAX, _full_pickle_load

SEED, TASKS, N_TEST = shared.SEED, shared.TASKS, shared.N_TEST  # the loops' common split
STEPS = 5  # batches a task (one epoch)
BATCH = 4
LOOP = {"lr": 1e-3, "weight_decay": 0.1, "warmup_steps": 2, "grad_clip": 1.0}
VISUAL = "image_encoder.model.visual."


def suite_strategy(**changes):
    """The suite's MagMax on the tiny CLIP with the loop's hyper-parameters (``changes`` on top)."""
    from strategies.methods.magmax import MagMax, MagMaxConfig

    config = MagMaxConfig(epochs=1, batch_size=BATCH, prompt_ensemble="cifar", **{**LOOP, **changes})
    return shared.tiny_clip_strategy(MagMax, config, float64=True)


@contextlib.contextmanager
def _inside(folder: Path):
    old = Path.cwd()
    os.chdir(folder)  # the official loop writes checkpoints/<model>/zeroshot.pt under the cwd
    try:
        yield
    finally:
        os.chdir(old)


@contextlib.contextmanager
def _replaced(owner, name: str, value):
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


@component("magmax.loop", MAGMAX)
def loop(checkout: Path) -> Golden:
    strategy = suite_strategy()
    model = strategy.backbone.model
    tensors = shared.loop_inputs(strategy.backbone.image_size, STEPS, BATCH)
    with torch.no_grad():  # the frozen zero-shot head of each task: s times the template ensemble
        heads = [strategy.backbone.logit_scale * strategy.text_features(list(c)) for c in TASKS]
        seen_head = strategy.backbone.logit_scale * strategy.text_features([c for t in TASKS for c in t])
    for t, head in enumerate(heads):
        tensors[f"input.head{t}"] = head
    initial = {n: p.detach().clone() for n, p in model.visual.named_parameters()}
    official_model = copy.deepcopy(model).requires_grad_(True)  # as open_clip builds it: all trainable

    live: dict[str, torch.nn.Module] = {}
    losses: list[float] = []
    records = [
        shared.StepRecord(
            lambda: {
                n[len(VISUAL) :]: p for n, p in live["model"].named_parameters() if n.startswith(VISUAL)
            },
            initial,
        )
        for _ in TASKS
    ]

    def forward_hook(module, _inputs, output):
        if isinstance(module, torch.nn.DataParallel):  # ImageClassifier's own __call__ skips hooks
            live["model"] = module.module  # the task's classifier (split > 0 reloads the encoder)
        if isinstance(module, torch.nn.CrossEntropyLoss):
            losses.append(float(output))

    def step_hook(optimizer):
        records[len(live["splits"]) - 1].step(losses[-1], [g["lr"] for g in optimizer.param_groups])

    def split(dataset, split_idx, image_encoder, args):
        live.setdefault("splits", []).append(split_idx)
        head_cls = __import__("sys").modules["src.modeling"].ClassificationHead
        batches = [
            (
                shared.on_host(tensors[f"input.task{split_idx}.x{s}"].double()),
                shared.on_host(tensors[f"input.task{split_idx}.y{s}"] - min(TASKS[split_idx])),
            )
            for s in range(STEPS)
        ]  # labels remapped to 0..k-1, as the official class_map of sorted classes does
        return SimpleNamespace(train_loader=batches), head_cls(normalize=True, weights=heads[split_idx])

    stubs = {
        "src.datasets.registry": stub_module(
            "src.datasets.registry", get_dataset=lambda *a, **k: SimpleNamespace()
        ),
        "src.cl_utils": stub_module("src.cl_utils", get_dataset_and_classifier_for_split=split),
        "src.eval": stub_module("src.eval", evaluate=lambda encoder, args: None),
    }
    args = SimpleNamespace(
        dataset="CIFAR100", n_splits=len(TASKS), epochs=1, seed=SEED, load=None, sequential_finetuning=True,
        model="tiny", openclip_cachedir=None, cache_dir=None, data_location=None, batch_size=BATCH, ls=0.0,
        lr=LOOP["lr"], wd=LOOP["weight_decay"], warmup_length=LOOP["warmup_steps"], split_strategy="class",
        device="cpu",
    )  # fmt: skip
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        args.save = str(tmp / "save")
        stack.enter_context(_inside(tmp))
        stack.enter_context(_full_pickle_load())
        stack.enter_context(
            _replaced(open_clip, "create_model_and_transforms", lambda *a, **k: (official_model, None, None))
        )
        stack.enter_context(_replaced(torch.nn.Module, "cuda", lambda self, *a, **k: self))
        # float64 throughout: the official ClassificationHead makes its bias in the default dtype
        stack.enter_context(shared.default_float64())
        load = stack.enter_context(official_import_path(checkout, stubs))
        handle = torch.nn.modules.module.register_module_forward_hook(forward_hook)
        stack.callback(handle.remove)
        official = load("finetune_splitted.py", "magmax_finetune_splitted")
        with shared.on_every_optimizer_step(step_hook):
            official.finetune(args)
        handle.remove()
        ckpt = Path(args.save) / f"CIFAR100-{len(TASKS)}" / f"ft-epochs-1-seed:{SEED}"
        pretrained = str(tmp / "checkpoints" / "tiny" / "zeroshot.pt")
        tv = load("src/merging/task_vectors.py", "src.merging.task_vectors")
        modeling = __import__("sys").modules["src.modeling"]
        vectors = [tv.TaskVector(pretrained, str(ckpt / f"finetuned_{i}.pt")) for i in range(len(TASKS))]
        seen = 0
        for t, record in enumerate(records):
            tensors.update(record.tensors(f"output.task{t}."))
            encoder = tv.merge_max_abs(vectors[: t + 1]).apply_to(pretrained, scaling_coef=0.5)
            seen += len(TASKS[t])
            head = modeling.ClassificationHead(normalize=True, weights=seen_head[:seen])
            with torch.no_grad():
                tensors[f"output.task{t}.scores"] = head(encoder.eval()(tensors["input.test_x"].double()))
    return Golden(
        component="magmax.loop",
        official=MAGMAX,
        file="finetune_splitted.py",
        function=(
            "finetune(args) over 2 splits (sequential_finetuning), then TaskVector, merge_max_abs and "
            "apply_to(pretrained, 0.5) of src/merging/task_vectors.py on tasks[:t+1] "
            "(merge_splitted.py evaluate_merged_fts), scored by src/modeling.py ClassificationHead"
        ),
        loading=(
            "finetune_splitted.py and src/{args,modeling,utils,datasets/common,merging/task_vectors}.py "
            "as is; stubbed: src.datasets.registry (no dataset), src.cl_utils."
            "get_dataset_and_classifier_for_split (returns the fixture's batches as the train loader, "
            "labels remapped as its class_map does, and a ClassificationHead of the suite's template "
            "ensemble times the logit scale: equal to the official head by magmax.head), src.eval."
            "evaluate (no-op); open_clip.create_model_and_transforms returns the suite's tiny CLIP "
            "(all parameters trainable, as open_clip builds it); nn.Module.cuda and the inputs' "
            ".to('cuda:0') stay on the CPU (DataParallel with no device is the module itself); "
            "checkpoints written by the official torch.save into a temporary cwd; torch's default dtype "
            "float64 while it runs (the official head makes its bias in it)"
        ),
        seed=SEED,
        sizes={"tasks": len(TASKS), "steps": STEPS, "batch": BATCH, "test_images": N_TEST},
        tensors=tensors,
        notes=(
            f"hyper-parameters {LOOP} (the recipe's but lr and warm-up, module docstring), 1 epoch of "
            f"{STEPS} batches a task. output.task{{t}}.step{{s}}: the CE loss, the lr of each param group "
            "as the step used it (cosine_lr sets it before the step), and the fingerprint "
            "(tests/official/goldens/loop.py) of each visual tensor's change from the "
            "pretrained weights after the step. output.task{t}.scores: the merged model "
            "(theta_0 + 0.5 merge_max_abs(tau_1..tau_t+1)) on input.test_x against the head of the "
            "classes seen so far. The model, heads and batches in float64 on both sides; the outputs "
            "and heads stored in float64."
        ),
        float64=("output.", "input.head"),
    )
