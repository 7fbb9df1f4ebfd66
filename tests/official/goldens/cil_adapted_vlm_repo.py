"""AdapterVLM (Fatflower/CIL_Adapted_VLM): its LoRA on k and v of both towers with the choice of a
visual branch per task, and its prototypes and inference scores, each run from the official files;
its training loss is ``cil_adapted_vlm_loss``'s, on the official modules loaded here.

* ``adaptervlm.lora``: ``backbone/two_clip/model_two.py`` ``CLIPAttention`` (``lora.Linear`` on k and
  v, ``lora_rank`` 24, loralib's default alpha 1) with the suite's weights: forward and gradients of
  the text LoRA and of the visual LoRA of task 2 in training mode; then the per-task branches as
  ``methods/multi_steps/clip_two.py`` makes and uses them (one visual LoRA object; ``_save_checkpoint``
  after each task keeps every ``lora_`` tensor; ``eval_task`` loads copy tau with
  ``load_state_dict(strict=False)``, then ``eval()``), under loralib 0.1.1 (pinned by the official
  requirements.txt) and 0.1.2.
* ``adaptervlm.scores``: ``clip_two.py`` ``_cal_image_prototype``, ``_cal_text_feature``,
  ``_save_checkpoint`` and ``eval_task`` over three tasks, around a stub network whose per-task visual
  "LoRA" is a table of seeded embeddings saved and re-loaded through the official checkpoints.

The suite's counterparts: ``benchmarks/backbone/lora.py`` (peft on ``SplitAttention``),
``strategies/methods/adaptervlm.py`` (``compute_logits``, ``compute_loss``, ``loss_terms``, ``prototype``,
``scores``, ``_scores_from_features``).

loralib is not a dependency of the suite: the generator imports it from ``<official-root>/loralib-0.1.1``
and ``<official-root>/loralib-0.1.2`` (``pip install --no-deps --target DIR loralib==VERSION``).
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import types
from pathlib import Path
from unittest import mock

import torch
from torch import nn

from benchmarks.core.errors import UserError
from strategies.settings import RunSettings
from tests.official.goldens import component
from tests.official.goldens.golden import (
    Golden,
    Official,
    looks_trained,
    official_import_path,
    stub_module,
)

CIL_ADAPTED_VLM = Official(
    "Fatflower/CIL_Adapted_VLM", "ae6bb9cce73ae9251bb7e82d0380b57a581fca7f", "CIL_Adapted_VLM"
)
SEED = 0
LORALIB_VERSIONS = ("0.1.1", "0.1.2")  # 0.1.1: the official requirements.txt
DIM = 512  # clip_two.py _cal_image_prototype and model_two.py update_mlp hard-code 512
SCORE_TASKS, SCORE_CLASSES, SCORE_TRAIN, SCORE_TEST = 3, 3, 3, 2  # tasks, classes/task, samples/class


# ============================================================================ imports and stubs
def _loralib_path(checkout: Path, version: str) -> Path:
    path = checkout.parent / f"loralib-{version}"
    if not (path / "loralib" / "layers.py").is_file():
        raise UserError(f"{path} is missing: pip install --no-deps --target {path} loralib=={version}")
    return path


def _stubs(checkout: Path) -> dict[str, types.ModuleType]:
    """The packages as plain path stubs (no __init__ is run); config_clip_two.py (transformers.onnx,
    gone from current transformers; only its classes' names are used at import), finetune_il.py (the
    base learner: its backbones, replay bank and optimiser helpers; every method run here is
    CLIP_TWO's own) and utils/data_manager.py (the dataset package) are stubs."""

    def package(name: str, folder: str) -> types.ModuleType:
        return stub_module(name, __path__=[str(checkout / folder)])

    class _Config:  # config_class attributes of model_two.py's PreTrainedModel subclasses
        pass

    return {
        "backbone": package("backbone", "backbone"),
        "backbone.two_clip": package("backbone.two_clip", "backbone/two_clip"),
        "backbone.two_clip.config_clip_two": stub_module(
            "backbone.two_clip.config_clip_two",
            CLIPConfig=_Config,
            CLIPTextConfig=_Config,
            CLIPVisionConfig=_Config,
        ),
        "methods": package("methods", "methods"),
        "methods.multi_steps": package("methods.multi_steps", "methods/multi_steps"),
        "methods.multi_steps.finetune_il": stub_module("methods.multi_steps.finetune_il", Finetune_IL=object),
        "utils": package("utils", "utils"),
        "utils.data_manager": stub_module("utils.data_manager", DataManager=None),
    }


@contextlib.contextmanager
def official_modules(checkout: Path, loralib: str = "0.1.1"):
    """Yields (model_two, clip_two) imported from the checkout with loralib ``loralib``."""
    sys.modules.pop("loralib", None)
    sys.path.insert(0, str(_loralib_path(checkout, loralib)))
    try:
        with official_import_path(checkout, _stubs(checkout)) as load:
            model_two = load("backbone/two_clip/model_two.py", "backbone.two_clip.model_two")
            clip_two = load("methods/multi_steps/clip_two.py", "methods.multi_steps.clip_two")
            assert sys.modules["loralib"].__file__.startswith(str(checkout.parent / f"loralib-{loralib}"))
            yield model_two, clip_two
    finally:
        sys.path.remove(str(_loralib_path(checkout, loralib)))
        for name in [n for n in sys.modules if n == "loralib" or n.startswith("loralib.")]:
            del sys.modules[name]


@contextlib.contextmanager
def on_cpu():
    """The official code calls ``.cuda()`` on every tensor and module: here the identity. Its
    ``torch.cuda.amp.autocast`` regions touch only CPU tensors (float32)."""
    with (
        mock.patch.object(torch.Tensor, "cuda", lambda self, *a, **k: self),
        mock.patch.object(nn.Module, "cuda", lambda self, *a, **k: self),
    ):
        yield


class _Logger:
    def info(self, *args, **kwargs):
        pass


def bare_learner(clip_two, **attributes):
    """A ``CLIP_TWO`` without its __init__ (which loads the HF processor, the prompt json and the
    datasets), with the attributes its methods read."""
    learner = object.__new__(clip_two.CLIP_TWO)
    learner.__dict__.update({"_logger": _Logger(), **attributes})
    return learner


def suite_strategy():
    """AdapterVLM on the tiny CLIP (synthetic weights) after ``setup_task(0)`` and ``setup_task(1)``:
    the text LoRA, visual_1 and visual_2 (a copy of visual_1)."""
    from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
    from strategies.methods.adaptervlm import AdapterVLM, AdapterVLMConfig

    torch.manual_seed(SEED)
    strategy = AdapterVLM(
        backbone=create_clip(BackboneSpec(TINY_MODEL, "synthetic")),
        class_names=["a", "b", "c", "d"],
        config=AdapterVLMConfig(),
        settings=RunSettings(show_progress=False),
    )
    strategy.setup_task(0, [0, 1])
    return strategy


# ============================================================================ adaptervlm.lora
def _attention_config(attn, rank: int) -> types.SimpleNamespace:
    """What model_two.py's CLIPAttention reads from its config."""
    return types.SimpleNamespace(
        hidden_size=attn.q_proj.weight.shape[0],
        num_attention_heads=attn.num_heads,
        lora_rank=rank,
        attention_dropout=0.0,
    )


def _copy_base(official: nn.Module, attn) -> None:
    with torch.no_grad():
        for name in ("q_proj", "out_proj"):
            getattr(official, name).weight.copy_(getattr(attn, name).weight)
            getattr(official, name).bias.copy_(getattr(attn, name).bias)
        for name in ("k_proj", "v_proj"):
            getattr(official, name).weight.copy_(getattr(attn, name).base_layer.weight)
            getattr(official, name).bias.copy_(getattr(attn, name).base_layer.bias)


def _copy_lora(official: nn.Module, lora: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for proj in ("k_proj", "v_proj"):
            getattr(official, proj).lora_A.copy_(lora[f"{proj}.lora_A"])
            getattr(official, proj).lora_B.copy_(lora[f"{proj}.lora_B"])


def _suite_lora(attn, adapter: str) -> dict[str, torch.Tensor]:
    return {
        f"{proj}.lora_{part}": getattr(getattr(attn, proj), f"lora_{part}")[adapter].weight.detach().clone()
        for proj in ("k_proj", "v_proj")
        for part in ("A", "B")
    }


def _causal_mask(batch: int, length: int) -> torch.Tensor:
    """model_two.py ``_make_causal_mask`` as CLIPTextTransformer passes it: [N, 1, L, L], finfo.min above
    the diagonal."""
    mask = torch.full((length, length), torch.finfo(torch.float32).min).triu(1)
    return mask[None, None].expand(batch, 1, length, length).clone()


@component("adaptervlm.lora", CIL_ADAPTED_VLM)
def lora(checkout: Path) -> Golden:
    from strategies.methods.adaptervlm import AdapterVLMConfig

    cfg = AdapterVLMConfig()
    strategy = suite_strategy()
    model = strategy.backbone.model
    generator = torch.Generator().manual_seed(SEED)
    towers = {"visual": model.visual.transformer, "text": model.transformer}
    # Made to look trained: the text LoRA and visual_1 after task 1, visual_2 (a copy) moved by task 2.
    for adapter, tower in (("text", "text"), ("visual_1", "visual")):
        for proj in ("k_proj", "v_proj"):
            looks_trained(getattr(towers[tower].resblocks[0].attn, proj).lora_B[adapter], generator)
    strategy.task_classes.append([0, 1])  # what the base records when task 1 ends
    strategy.setup_task(1, [2, 3])  # visual_2 = copy of visual_1
    for proj in ("k_proj", "v_proj"):
        layer = getattr(towers["visual"].resblocks[0].attn, proj)
        looks_trained(layer.lora_A["visual_2"], generator, scale=0.01)
        looks_trained(layer.lora_B["visual_2"], generator)
    tensors: dict[str, torch.Tensor] = {}
    sizes: dict[str, int] = {"rank": cfg.lora_rank}
    for tower, adapter in (("text", "text"), ("visual", "visual_1"), ("visual", "visual_2")):
        attn = towers[tower].resblocks[0].attn
        for key, value in _suite_lora(attn, adapter).items():
            tensors[f"param.{adapter}.{key}"] = value
    for tower in towers:
        attn = towers[tower].resblocks[0].attn
        for name in ("q_proj", "out_proj"):
            tensors[f"param.{tower}.{name}.weight"] = getattr(attn, name).weight.detach().clone()
            tensors[f"param.{tower}.{name}.bias"] = getattr(attn, name).bias.detach().clone()
        for name in ("k_proj", "v_proj"):
            tensors[f"param.{tower}.{name}.weight"] = getattr(attn, name).base_layer.weight.detach().clone()
            tensors[f"param.{tower}.{name}.bias"] = getattr(attn, name).base_layer.bias.detach().clone()
        sizes[f"{tower}_width"], sizes[f"{tower}_heads"] = attn.q_proj.weight.shape[0], attn.num_heads

    # 1. training forward and gradients: the text LoRA (causal mask) and visual_2, train() mode.
    with official_modules(checkout, "0.1.1") as (model_two, _):
        for tower, adapter in (("text", "text"), ("visual", "visual_2")):
            attn = towers[tower].resblocks[0].attn
            official = model_two.CLIPAttention(_attention_config(attn, cfg.lora_rank))
            _copy_base(official, attn)
            _copy_lora(official, _suite_lora(attn, adapter))
            official.train()
            length = 8 if tower == "text" else 17  # text: a context of 8; visual: 16 patches + class
            x = torch.randn(3, length, sizes[f"{tower}_width"], generator=generator)  # [N, L, E]
            mask = _causal_mask(3, length) if tower == "text" else None
            weight = torch.randn(3, length, sizes[f"{tower}_width"], generator=generator)
            out = official(x, causal_attention_mask=mask)[0]
            loss = (out * weight).sum()
            loss.backward()
            for proj in ("k_proj", "v_proj"):
                layer = getattr(official, proj)
                tensors[f"grad.{adapter}.{proj}.lora_A"] = layer.lora_A.grad
                tensors[f"grad.{adapter}.{proj}.lora_B"] = layer.lora_B.grad
                tensors[f"output.{tower}.scaling"] = torch.tensor(layer.scaling, dtype=torch.float64)
            trainable = sorted(n for n, p in official.named_parameters() if p.requires_grad and "lora_" in n)
            tensors[f"input.{tower}.x"] = x
            tensors[f"input.{tower}.loss_weight"] = weight
            if mask is not None:
                tensors[f"input.{tower}.causal_mask"] = mask
            tensors[f"output.{tower}.attention"] = out
            tensors[f"output.{tower}.loss"] = loss.detach()
            sizes[f"{tower}_lora_tensors"] = len(trainable)

    # 2. the branches: one visual LoRA object, a checkpoint after each task, copy tau loaded at test.
    attn = towers["visual"].resblocks[0].attn
    x_eval = torch.randn(3, 17, sizes["visual_width"], generator=generator)
    tensors["input.branches.x"] = x_eval
    for version in LORALIB_VERSIONS:
        with (
            official_modules(checkout, version) as (model_two, clip_two),
            on_cpu(),
            tempfile.TemporaryDirectory() as tmp,
        ):
            network = nn.Module()  # stands for clip_two: its vision tower's attention under image_features
            network.image_features = model_two.CLIPAttention(_attention_config(attn, cfg.lora_rank))
            _copy_base(network.image_features, attn)
            learner = bare_learner(
                clip_two,
                _logdir=tmp,
                _config=types.SimpleNamespace(get_parameters_dict=dict),
                image_prototype=torch.zeros(1),
                pre_text_features=torch.zeros(1),
            )
            for task, adapter in enumerate(("visual_1", "visual_2")):
                network.train()  # _epoch_train: model.train(); the training moved the LoRA to adapter's
                _copy_lora(network.image_features, _suite_lora(attn, adapter))
                network.eval()  # _train_model's and _cal_image_prototype's model.eval()
                learner._cur_task = task
                learner._save_checkpoint(f"seed0_task{task}_checkpoint.pkl", network.cpu())
            for task in range(2):  # eval_task: load_state_dict(checkpoint, strict=False), then eval()
                checkpoint = torch.load(Path(tmp) / f"seed0_task{task}_checkpoint.pkl", weights_only=False)
                network.load_state_dict(checkpoint, strict=False)
                network.eval()
                with torch.no_grad():
                    out = network.image_features(x_eval)[0]
                tensors[f"output.branches.loralib_{version}.branch{task + 1}"] = out
                merged = network.image_features.k_proj.merged
                tensors[f"output.branches.loralib_{version}.merged"] = torch.tensor(bool(merged))
    return Golden(
        component="adaptervlm.lora",
        official=CIL_ADAPTED_VLM,
        file="backbone/two_clip/model_two.py, methods/multi_steps/clip_two.py",
        function="CLIPAttention (lora.Linear on k_proj, v_proj) forward; CLIP_TWO._save_checkpoint; "
        "eval_task's load_state_dict(strict=False) + eval() per branch",
        loading=(
            "packages backbone, methods, utils as path stubs (no __init__ run); config_clip_two.py stubbed "
            "(imports transformers.onnx, absent from transformers 5; only class names used), "
            "finetune_il.py stubbed (Finetune_IL = object: the base learner is not used), "
            "utils/data_manager.py stubbed (the dataset package); loralib 0.1.1 (the official "
            "requirements.txt) and 0.1.2 from pip --target folders beside the checkout; .cuda() is the "
            "identity; CLIP_TWO built without __init__ (HF processor, prompts, datasets)"
        ),
        seed=SEED,
        sizes=sizes,
        tensors=tensors,
        notes=(
            "Block 0's attention of each tower of the suite's tiny CLIP (synthetic weights) with "
            "AdapterVLM's peft LoRA (rank 24, alpha 1); text and visual_1 B given a seeded 0.05 randn, "
            "visual_2 (setup_task(1)'s copy of visual_1) moved by 0.01 randn on A and 0.05 on B; the "
            "weights copied into the official CLIPAttention (batch first). 1: train() forward, loss = "
            "sum(out * loss_weight), gradients of lora_A/B of k and v (text with the causal mask). "
            "2: the official single visual LoRA object set to visual_1, eval(), _save_checkpoint; "
            "train(), set to visual_2, eval(), _save_checkpoint; then per branch load_state_dict("
            "checkpoint, strict=False), eval(), forward of input.branches.x; under loralib 0.1.1 and "
            "0.1.2 (output.branches.loralib_<v>.merged: whether lora.Linear merged B A into its weight)."
        ),
    )


# ============================================================================ adaptervlm.scores
class _TableNet(nn.Module):
    """Stands for clip_two at evaluation: the visual "LoRA" is a table of raw image embeddings by
    sample id (``lora_table``: saved and re-loaded by the official checkpoints as the LoRA tensors
    are), the text tower a table of raw text embeddings by the prompt's first token."""

    def __init__(self, n_samples: int, n_classes: int):
        super().__init__()
        self.lora_table = nn.Parameter(torch.zeros(n_samples, DIM), requires_grad=False)
        self.text_table = nn.Parameter(torch.zeros(n_classes, DIM), requires_grad=False)

    def get_images_feature(self, images):
        return self.lora_table[images[:, 0, 0, 0].long()]

    def get_texts_feature(self, input_ids, attention_mask):
        return self.text_table[input_ids[:, 0]]


@contextlib.contextmanager
def _locals_at_return(code: types.CodeType, into: list[dict]):
    """Append a copy of the locals of every call of ``code`` as it returns."""

    def profile(frame, event, arg):
        if event == "return" and frame.f_code is code:
            into.append(
                {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in frame.f_locals.items()}
            )

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(previous)


@component("adaptervlm.scores", CIL_ADAPTED_VLM)
def scores(checkout: Path) -> Golden:
    from strategies.methods.adaptervlm import AdapterVLMConfig

    cfg = AdapterVLMConfig()
    generator = torch.Generator().manual_seed(SEED)
    n_classes = SCORE_TASKS * SCORE_CLASSES
    order = torch.randperm(n_classes, generator=generator)
    per_class = SCORE_TRAIN + SCORE_TEST
    labels = torch.arange(n_classes).repeat_interleave(per_class)  # ordered labels of all samples
    n_samples = len(labels)
    is_test = (torch.arange(n_samples) % per_class) >= SCORE_TRAIN
    centres = torch.randn(n_classes, DIM, generator=generator)
    tensors: dict[str, torch.Tensor] = {
        "input.order": order,
        "input.labels": labels,
        "input.is_test": is_test,
    }
    stages: list[dict] = []
    with official_modules(checkout) as (_, clip_two), on_cpu(), tempfile.TemporaryDirectory() as tmp:
        net = _TableNet(n_samples, n_classes)
        learner = bare_learner(
            clip_two,
            _logdir=tmp,
            _config=types.SimpleNamespace(get_parameters_dict=dict, test_dir=None),
            _seed=0,
            _increment_steps=[SCORE_CLASSES] * SCORE_TASKS,
            _increment=SCORE_CLASSES,
            _order=order,
            _network=net,
            _lambda=cfg.lam,
            _beta=cfg.beta,
            _is_openset_test=False,
            _eval_metric="acc",
            _cil_record=[],
            _tid_record=[],
            _nb_tasks=SCORE_TASKS,
        )
        tokens = {
            "input_ids": torch.arange(n_classes)[:, None].repeat(1, 4),
            "attention_mask": torch.ones(n_classes, 4, dtype=torch.long),
        }
        for task in range(SCORE_TASKS):
            begin, end = task * SCORE_CLASSES, (task + 1) * SCORE_CLASSES
            # branch task: embeddings near the class centre; other tasks' samples drawn towards one of
            # this task's classes (so that a wrong branch can win)
            noise = torch.randn(n_samples, DIM, generator=generator)
            own = (labels >= begin) & (labels < end)
            lure = centres[torch.randint(begin, end, (n_samples,), generator=generator)]
            table = (
                centres[labels]
                + torch.where(own, 0.0, 0.6 + torch.rand(n_samples, generator=generator))[:, None] * lure
                + 1.5 * noise
            )
            text = 3.0 * centres + torch.randn(n_classes, DIM, generator=generator)  # by position
            with torch.no_grad():
                net.lora_table.copy_(table)
                net.text_table[order] = (
                    text  # prompt rows by class id; the text of position p is row order[p]
                )
            tensors[f"input.branch{task + 1}.table"] = table
            tensors[f"input.stage{task + 1}.text"] = text
            train_ids = torch.nonzero(own & ~is_test).flatten()
            proto_loader = [
                (ids, ids.float()[:, None, None, None], labels[ids]) for ids in train_ids.split(4)
            ]  # batches of 4: the scatter_add runs over several batches
            test_ids = torch.nonzero((labels < end) & is_test).flatten()
            learner._cur_task = task
            learner._test_loader = [
                (ids, ids.float()[:, None, None, None], labels[ids]) for ids in test_ids.split(5)
            ]
            learner._cur_task_test_samples_num = len(test_ids)
            learner._cal_image_prototype(net, proto_loader, task_id=task)
            learner._cal_text_feature(net, tokens, task_id=task)
            learner._save_checkpoint(f"seed0_task{task}_checkpoint.pkl", net.cpu())
            tensors[f"output.branch{task + 1}.prototypes"] = learner.image_prototype
            tensors[f"output.stage{task + 1}.text_features"] = learner.pre_text_features
            tensors[f"input.stage{task + 1}.test_ids"] = test_ids
            with _locals_at_return(clip_two.CLIP_TWO.eval_task.__code__, stages):
                learner.eval_task()
            found = stages[-1]
            tensors[f"output.stage{task + 1}.scores"] = found["all_task_logits"]
            tensors[f"output.stage{task + 1}.task_max"] = found["all_tasks_ood_scores"]
            tensors[f"output.stage{task + 1}.task_id"] = found["task_id_per_image"]
            tensors[f"output.stage{task + 1}.prediction"] = found["all_tasks_preds"]
            tensors[f"output.stage{task + 1}.accuracy"] = torch.tensor(
                learner._cil_record[-1], dtype=torch.float64
            )
    return Golden(
        component="adaptervlm.scores",
        official=CIL_ADAPTED_VLM,
        file="methods/multi_steps/clip_two.py",
        function="CLIP_TWO._cal_image_prototype, _cal_text_feature, _save_checkpoint, eval_task",
        loading=(
            "as adaptervlm.lora (path stubs for the packages; config_clip_two.py, finetune_il.py, "
            "utils/data_manager.py stubbed); CLIP_TWO built without __init__; .cuda() the identity, "
            "autocast inactive on CPU tensors; the network a stub (_TableNet) whose per-task visual "
            "'LoRA' is a table of embeddings that the official _save_checkpoint saves (a 'lora_' name) "
            "and eval_task re-loads per branch; eval_task's locals read as it returns (sys.setprofile)"
        ),
        seed=SEED,
        sizes={
            "tasks": SCORE_TASKS,
            "classes_per_task": SCORE_CLASSES,
            "train_per_class": SCORE_TRAIN,
            "test_per_class": SCORE_TEST,
            "dim": DIM,
        },
        tensors=tensors,
        notes=(
            "Three tasks of 3 classes in a seeded class order; labels are positions in that order. After "
            "task t: branch t's raw embeddings of every sample (input.branch<t>.table), the text's raw "
            "embeddings by position (input.stage<t>.text, a sliding text tower); the official prototypes "
            "of task t's classes from their train samples (in batches of 4), its text features of all "
            "seen classes, the checkpoint, then eval_task over the test samples of the seen classes (in "
            "batches of 5): scores [samples, seen classes] (lambda <v, p_c> + beta <v, t_c> under each "
            "branch), each task's max, the chosen task, the prediction and the accuracy."
        ),
    )
