"""MagMax (danielm1405/magmax): the max-magnitude merge of task vectors, the zero-shot head with its
template ensemble, and the warm-up + cosine learning-rate schedule, each run from the official
files (``src/merging/task_vectors.py``, ``src/heads.py``, ``src/datasets/templates.py``,
``src/modeling.py``, ``src/utils.py``, ``src/args.py``) on seeded inputs.

The suite's counterparts: ``benchmarks/backbone/full_tuning.py`` (``difference``,
``max_magnitude``, ``scaled_sum``), ``strategies/methods/magmax.py`` (``merged``, ``finish_task``,
the head), ``strategies/base.py`` (``text_features``: the ensemble), ``benchmarks/data/prompts.py``
(``CIFAR_TEMPLATES``) and ``strategies/optim.py`` (``build_scheduler``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path

import open_clip
import torch
from torch import nn

from tests.official.goldens import component
from tests.official.goldens.golden import Golden, Official, official_import_path, stub_module

MAGMAX = Official("danielm1405/magmax", "4f49f18fb30216d3a0dbe4220b469a3273e45475", "magmax")

SEED = 0
N_TASKS = 3  # task vectors merged (stages 1..3, as evaluate_merged_fts merges task_vectors[:idx+1])
MERGE_LAMBDA = 0.5  # merge_splitted.py: (merge_max_abs, [0.5])
GRID = 2.0**-16  # weights and deltas on this grid: every sum and difference below is exact in fp32
HEAD_CLASSES = (3, 0, 7, 5)  # a subset head, in this order (build_subset_classification_head)
N_CLASSNAMES = 10
N_IMAGES = 6
# (epochs * batches a task, warm-up): CIFAR-100/10 tasks has 10 * ceil(5000 / 128) = 400 steps, the
# warm-up of 500 never ends; the second schedule ends it, so the cosine branch runs too.
SCHEDULES = ((400, 500), (1200, 500))
BASE_LR = 1e-5


def micro_clip() -> open_clip.CLIP:
    """The suite's CLIP module type (open_clip ``CLIP``, quick GELU, attention split into q/k/v/out
    as ``create_clip`` does) at a micro size, so that a fixture of seven visual states stays small;
    the merge is elementwise, so only names and shapes matter. Randomly initialised, seed 0."""
    from benchmarks.backbone.attention import split_attention_

    with torch.random.fork_rng():
        torch.manual_seed(SEED)
        model = open_clip.CLIP(
            embed_dim=16,
            vision_cfg={"image_size": 16, "patch_size": 8, "width": 16, "head_width": 8, "layers": 2},
            text_cfg={"context_length": 8, "vocab_size": 64, "width": 16, "heads": 2, "layers": 1},
            quick_gelu=True,
        )
    split_attention_(model)
    return model.eval()


def _on_grid(t: torch.Tensor) -> torch.Tensor:
    return torch.round(t / GRID) * GRID


@contextlib.contextmanager
def _full_pickle_load():
    """The official ``TaskVector`` and ``apply_to`` call ``torch.load`` on whole pickled modules
    (torch < 2.6 semantics); torch >= 2.6 needs this switch for that."""
    key = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
    old = os.environ.get(key)
    os.environ[key] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


@component("magmax.merge", MAGMAX)
def merge(checkout: Path) -> Golden:
    from benchmarks.backbone.full_tuning import load_visual_state, visual_state

    model = micro_clip()
    theta_0 = {name: _on_grid(t) for name, t in visual_state(model).items()}
    generator = torch.Generator().manual_seed(SEED)
    names = list(theta_0)
    deltas: list[dict[str, torch.Tensor]] = []
    for task in range(N_TASKS):
        delta = {n: _on_grid(1e-2 * torch.randn(theta_0[n].shape, generator=generator)) for n in names}
        if task == 1:  # exact ties with task 0, of opposite sign: the later task must win
            for n in names:
                tie = torch.rand(delta[n].shape, generator=generator) < 0.25
                delta[n] = torch.where(tie, -deltas[0][n], delta[n])
        if task == 2:  # exact ties with task 1 (same sign), and zeros in both
            for n in names:
                tie = torch.rand(delta[n].shape, generator=generator) < 0.25
                delta[n] = torch.where(tie, deltas[1][n], delta[n])
        deltas.append(delta)
    thetas = [{n: theta_0[n] + delta[n] for n in names} for delta in deltas]

    tensors: dict[str, torch.Tensor] = {f"param.theta_0.{n}": t for n, t in theta_0.items()}
    for task, theta in enumerate(thetas):
        tensors.update({f"input.theta_{task + 1}.{n}": t for n, t in theta.items()})
    with tempfile.TemporaryDirectory() as tmp, _full_pickle_load():
        # The official files hold pickled image encoders; here the visual tower itself.
        pretrained = Path(tmp) / "zeroshot.pt"
        load_visual_state(model, theta_0)
        torch.save(model.visual, pretrained)
        finetuned = []
        for task, theta in enumerate(thetas):
            load_visual_state(model, theta)
            finetuned.append(Path(tmp) / f"finetuned_{task}.pt")
            torch.save(model.visual, finetuned[-1])
        with official_import_path(checkout) as load:
            tv = load("src/merging/task_vectors.py", "magmax_task_vectors")
            vectors = [tv.TaskVector(str(pretrained), str(path)) for path in finetuned]
            for stage in range(1, N_TASKS + 1):  # evaluate_merged_fts: merge task_vectors[:idx + 1]
                merged_tv = tv.merge_max_abs(vectors[:stage])
                encoder = merged_tv.apply_to(str(pretrained), scaling_coef=MERGE_LAMBDA)
                for n, t in merged_tv.vector.items():
                    tensors[f"state.tau_run_{stage}.{n}"] = t
                for n, t in encoder.state_dict().items():
                    tensors[f"output.merged_{stage}.{n}"] = t
    return Golden(
        component="magmax.merge",
        official=MAGMAX,
        file="src/merging/task_vectors.py",
        function="TaskVector(pretrained, finetuned), merge_max_abs, TaskVector.apply_to",
        loading=(
            "task_vectors.py imported as is (it imports only torch); the pretrained and fine-tuned "
            "checkpoints are the suite's visual tower pickled with torch.save and read by the official "
            "torch.load (TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1, as torch < 2.6 loaded them); nothing stubbed"
        ),
        seed=SEED,
        sizes={
            "tasks": N_TASKS,
            "tensors_per_state": len(names),
            "numel": sum(t.numel() for t in theta_0.values()),
        },
        tensors=tensors,
        notes=(
            "theta_t = theta_0 + delta_t (sequential fine-tuning, so theta_t is where the next task "
            "starts); theta_0 is the suite's visual tower (micro_clip: open_clip CLIP after "
            "split_attention_, width 16, 2 blocks) and the deltas are seeded (1e-2 randn), all on a "
            "2**-16 grid so that task vectors are exact; task 2 ties task 1 with the opposite sign on "
            "25% of entries, task 3 ties task 2 with the same sign on 25%. Stage s merges "
            "task_vectors[:s] (merge_splitted.py evaluate_merged_fts) with lambda 0.5 (search_evaluate_"
            "merging's coefficient for merge_max_abs). output.merged_s is apply_to(...).state_dict()."
        ),
    )


class _TextStub(nn.Module):
    """Stands in for the open_clip model in ``build_subset_classification_head``: ``encode_text``
    returns the seeded (unnormalised) per-template features of the next class, in call order,
    and records the tokens it was given."""

    def __init__(self, features: torch.Tensor, logit_scale: torch.Tensor) -> None:
        super().__init__()
        self.features = features  # [classes, templates, d]
        self.logit_scale = nn.Parameter(logit_scale.clone())
        self.calls: list[torch.Tensor] = []

    def encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        self.calls.append(tokens.clone())
        return self.features[len(self.calls) - 1].clone()


def _text_bytes(texts: list[str]) -> torch.Tensor:
    """Strings as rows of UTF-8 bytes (0-padded), for a fixture of tensors."""
    rows = [list(t.encode()) for t in texts]
    width = max(len(r) for r in rows)
    return torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int64)


@contextlib.contextmanager
def _argv(argv: list[str]):
    old = sys.argv
    sys.argv = argv
    try:
        yield
    finally:
        sys.argv = old


@component("magmax.head", MAGMAX)
def head(checkout: Path) -> Golden:
    from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip

    backbone = create_clip(BackboneSpec(TINY_MODEL, "synthetic"))
    logit_scale = backbone.model.logit_scale.detach().clone()  # the suite's log scale
    d = backbone.embed_dim
    generator = torch.Generator().manual_seed(SEED)
    classnames = [f"class{i}" for i in range(N_CLASSNAMES)]
    tensors: dict[str, torch.Tensor] = {"param.logit_scale": logit_scale}
    registry = stub_module(
        "src.datasets.registry",
        get_dataset=lambda name, preprocess, location, **kw: stub_module("dataset", classnames=classnames),
    )
    with official_import_path(checkout, {"src.datasets.registry": registry}) as load:
        templates_module = load("src/datasets/templates.py", "src.datasets.templates")
        templates = [t("{}") for t in templates_module.get_templates("CIFAR100")]
        features = torch.randn(len(HEAD_CLASSES), len(templates), d, generator=generator)
        images = torch.randn(N_IMAGES, d, generator=generator)
        heads = load("src/heads.py", "src.heads")
        stub = _TextStub(features, logit_scale)
        classification_head = heads.build_subset_classification_head(
            stub, "CIFAR100", list(HEAD_CLASSES), "unused", "cpu"
        )
        logits = classification_head(images)
        tensors["input.text_features"] = features
        tensors["input.image_features"] = images
        tensors["input.classes"] = torch.tensor(HEAD_CLASSES)
        tensors["output.templates_cifar100"] = _text_bytes(templates)
        tensors["output.templates_imagenet"] = _text_bytes(
            [t("{}") for t in templates_module.get_templates("ImageNet")]
        )
        tensors["output.templates_imagenetr"] = _text_bytes(
            [t("{}") for t in templates_module.get_templates("ImageNetR")]
        )
        tensors["output.prompts_first_class"] = stub.calls[0]  # open_clip tokens of class 3's prompts
        tensors["output.head_weight"] = classification_head.weight
        tensors["output.head_bias"] = classification_head.bias
        tensors["output.logits"] = logits

        # The schedule: cosine_lr's adjuster, called with each step before the optimiser steps.
        utils = load("src/utils.py", "src.utils")
        for steps, warmup in SCHEDULES:
            optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=BASE_LR)
            adjust = utils.cosine_lr(optimizer, BASE_LR, warmup, steps)
            lrs = []
            for step in range(steps):
                adjust(step)
                lrs.append(optimizer.param_groups[0]["lr"])
            tensors[f"output.lr_steps{steps}_warmup{warmup}"] = torch.tensor(lrs, dtype=torch.float64)

        # The recipe's defaults, from the official argument parser (finetune_splitted.py then sets
        # lr = 1e-5 and batch_size = 128 itself).
        args_module = load("src/args.py", "src.args")
        with _argv(["finetune_splitted.py"]):
            args = args_module.parse_arguments()
        for key in ("lr", "wd", "ls", "warmup_length", "epochs", "batch_size"):
            tensors[f"output.args.{key}"] = torch.tensor(float(getattr(args, key)), dtype=torch.float64)
    return Golden(
        component="magmax.head",
        official=MAGMAX,
        file="src/heads.py",
        function=(
            "build_subset_classification_head and ClassificationHead.forward (src/modeling.py); "
            "get_templates (src/datasets/templates.py); cosine_lr (src/utils.py); "
            "parse_arguments (src/args.py)"
        ),
        loading=(
            "src.datasets.registry stubbed (get_dataset returns only classnames: the real one imports "
            "every dataset); the model passed to build_subset_classification_head is a stub whose "
            "encode_text returns seeded per-template features (one call a class, in class order) and "
            "whose logit_scale is the suite's tiny CLIP's; open_clip.tokenize is the real one; "
            "templates, modeling, utils and args imported as is"
        ),
        seed=SEED,
        sizes={"classes": len(HEAD_CLASSES), "templates": len(templates), "dim": d, "images": N_IMAGES},
        tensors=tensors,
        notes=(
            "output.templates_* are the official template lists applied to '{}' (UTF-8 byte rows). "
            "output.logits = ClassificationHead(normalize=True)(input.image_features). "
            "output.lr_steps{S}_warmup{W}: the lr that cosine_lr(optimizer, 1e-5, W, S) sets before step "
            "0..S-1 (stored as float64, rounded to float32 by the fixture). output.args.*: the defaults "
            "of src/args.py."
        ),
    )
