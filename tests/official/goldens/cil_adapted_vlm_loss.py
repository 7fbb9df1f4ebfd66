"""AdapterVLM's training loss (Fatflower/CIL_Adapted_VLM), run from the official files that
``cil_adapted_vlm_repo`` loads.

* ``adaptervlm.loss``: ``clip_two.py`` ``CLIP_TWO._epoch_train`` (two batches, the last one partial, at
  task 1 and at task 2) around a stub network whose image and text embeddings are seeded leaf
  tensors and whose auxiliary MLP is the official ``clip_two.update_mlp``'s with the suite's weights.

The suite's counterpart: ``strategies/methods/adaptervlm.py`` (``compute_loss``, ``loss_terms``).
"""

from __future__ import annotations

import math
import types
from pathlib import Path

import torch
from torch import nn

from tests.official.goldens import component
from tests.official.goldens.cil_adapted_vlm_repo import (
    CIL_ADAPTED_VLM,
    DIM,
    SEED,
    bare_learner,
    official_modules,
    on_cpu,
)
from tests.official.goldens.golden import Golden, looks_trained

LOSS_CLASSES, LOSS_BATCHES = 3, (4, 2)  # classes per task; the batch sizes of the two steps


class _FeatureNet(nn.Module):
    """Stands for clip_two in ``_epoch_train``: ``forward(images, input_ids, attention_mask)`` returns
    the rows of two leaf tensors, raw image embeddings by sample id (the images carry their ids) and
    raw text embeddings by the prompt's first token (the class id); ``get_mlp`` and ``update_mlp`` are
    the official ones, bound to this module."""

    def __init__(self, clip_two, images: torch.Tensor, texts: torch.Tensor, logit_scale: torch.Tensor):
        super().__init__()
        self.images = nn.Parameter(images.clone())
        self.texts = nn.Parameter(texts.clone())
        self.logit_scale = nn.Parameter(logit_scale.clone(), requires_grad=False)
        self.visual_feature_dim = images.shape[1]
        self.aux_mlp = nn.Identity()
        self.update_mlp = types.MethodType(clip_two.clip_two.update_mlp, self)
        self.get_mlp = types.MethodType(clip_two.clip_two.get_mlp, self)
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, images, input_ids, attention_mask):
        ids = images[:, 0, 0, 0].long()
        self.calls.append((ids.clone(), input_ids[:, 0].clone()))
        return self.images[ids], self.texts[input_ids[:, 0]]


class _RecordingScaler:
    """``GradScaler`` as it is without CUDA (disabled: the identity), recording the loss."""

    def __init__(self):
        self.losses: list[torch.Tensor] = []

    def scale(self, loss):
        self.losses.append(loss.detach().clone())
        return loss

    def step(self, optimizer):
        optimizer.step()

    def update(self):
        pass


class _RecordingOptimizer:
    """Records the gradient of every parameter at each step (and changes nothing)."""

    def __init__(self, named: dict[str, nn.Parameter]):
        self.named = named
        self.steps: list[dict[str, torch.Tensor]] = []

    def zero_grad(self):
        for p in self.named.values():
            p.grad = None

    def step(self):
        self.steps.append(
            {
                n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
                for n, p in self.named.items()
            }
        )


def _recorded(function, log: list):
    def call(*args, **kwargs):
        out = function(*args, **kwargs)
        log.append(out.detach().clone())
        return out

    return call


@component("adaptervlm.loss", CIL_ADAPTED_VLM)
def loss(checkout: Path) -> Golden:
    from strategies.methods.adaptervlm import AdapterVLMConfig, aux_head

    cfg = AdapterVLMConfig()
    generator = torch.Generator().manual_seed(SEED)
    n_classes, n_train = 2 * LOSS_CLASSES, sum(LOSS_BATCHES)
    order = torch.randperm(n_classes, generator=generator)  # data_manager's class order
    # Text embeddings sharing a direction (cosines near tau, so that the hinge is active for some pairs).
    common = torch.randn(DIM, generator=generator)
    spread = torch.empty(n_classes)
    spread[order] = torch.tensor([0.25, 0.45, 0.65]).repeat(2)  # by position: some pairs above tau
    texts = common + spread[:, None] * common.norm() / math.sqrt(DIM) * torch.randn(
        n_classes, DIM, generator=generator
    )
    texts = texts * 3.0
    logit_scale = torch.tensor(math.log(100.0))
    tensors: dict[str, torch.Tensor] = {
        "input.order": order,
        "input.texts": texts,
        "param.logit_scale": logit_scale,
        "input.tau": torch.tensor(cfg.tau, dtype=torch.float64),
    }
    with official_modules(checkout) as (_, clip_two), on_cpu():
        for task in range(2):
            begin, end = task * LOSS_CLASSES, (task + 1) * LOSS_CLASSES
            # samples: n_train task images (ids 0..), then n_train pseudo-OOD images
            images = 2.0 * torch.randn(2 * n_train, DIM, generator=generator)
            labels = torch.arange(begin, end).repeat(math.ceil(n_train / LOSS_CLASSES))[:n_train]
            labels = labels[torch.randperm(n_train, generator=generator)]
            ood_ids = n_train + torch.randperm(n_train, generator=generator)
            net = _FeatureNet(clip_two, images, texts, logit_scale)
            net.update_mlp(LOSS_CLASSES)  # incremental_train: update_mlp(self._cur_classes)
            torch.manual_seed(SEED + task)
            suite_aux = aux_head(DIM, LOSS_CLASSES)  # the suite's initial MLP, seeded
            looks_trained(suite_aux, generator)
            with torch.no_grad():
                for official, ours in zip(net.aux_mlp.parameters(), suite_aux.parameters(), strict=True):
                    official.copy_(ours)
            train_loader, ood_loader, start = [], [], 0
            for size in LOSS_BATCHES:
                ids = torch.arange(start, start + size)
                train_loader.append((ids, ids.float()[:, None, None, None], labels[ids]))
                ood = ood_ids[start : start + size]
                ood_loader.append((ood, ood.float()[:, None, None, None], torch.zeros_like(ood)))
                start += size
            anchors = torch.nn.functional.normalize(
                texts[order[:begin]] + 0.5 * torch.randn(begin, DIM, generator=generator), dim=-1
            )
            named = {"images": net.images, "texts": net.texts}
            named.update({f"aux.{n}": p for n, p in net.aux_mlp.named_parameters()})
            optimizer, scaler = _RecordingOptimizer(named), _RecordingScaler()
            terms: dict[str, list] = {"clip": [], "ce": [], "dist": [], "anchor": []}
            learner = bare_learner(
                clip_two,
                _increment_steps=[LOSS_CLASSES, LOSS_CLASSES],
                _order=order,
                _train_loader_OOD=ood_loader,
                _scaler=scaler,
                sim_threshold=cfg.tau,
                _gama=1,
                _theta=1,
                _alpha=1,  # options/clip_two/cifar100.yaml: gama, theta, alpha
                pre_text_features=anchors,
            )
            for name, method in (
                ("clip", "_clip_loss"),
                ("ce", "_ce_loss"),
                ("dist", "_text_distance_loss"),
                ("anchor", "_text_cos_loss"),
            ):
                setattr(learner, method, _recorded(getattr(learner, method), terms[name]))
            tokens = {
                "input_ids": torch.arange(n_classes)[:, None].repeat(1, 4),
                "attention_mask": torch.ones(n_classes, 4, dtype=torch.long),
            }
            learner._epoch_train(net, train_loader, optimizer, None, text_tokens=tokens, task_begin=begin,
                                 task_end=end, task_id=task)  # fmt: skip
            prefix = f"task{task + 1}"
            tensors[f"input.{prefix}.images"] = images
            tensors[f"input.{prefix}.labels"] = labels  # ordered labels (positions in the class order)
            tensors[f"input.{prefix}.anchors"] = anchors
            for name, p in net.aux_mlp.named_parameters():
                tensors[f"param.{prefix}.aux.{name}"] = p.detach().clone()
            for step, (image_ids, text_ids) in enumerate(net.calls):
                tensors[f"input.{prefix}.step{step}.image_ids"] = image_ids
                tensors[f"input.{prefix}.step{step}.text_ids"] = text_ids
                tensors[f"output.{prefix}.step{step}.loss"] = scaler.losses[step]
                for name, values in terms.items():
                    if values:
                        tensors[f"output.{prefix}.step{step}.{name}"] = values[step]
                for name, grad in optimizer.steps[step].items():
                    tensors[f"grad.{prefix}.step{step}.{name}"] = grad
    return Golden(
        component="adaptervlm.loss",
        official=CIL_ADAPTED_VLM,
        file="methods/multi_steps/clip_two.py, backbone/two_clip/model_two.py",
        function="CLIP_TWO._epoch_train (_clip_loss, _ce_loss, _text_distance_loss, _text_cos_loss); "
        "clip_two.update_mlp, get_mlp",
        loading=(
            "as adaptervlm.lora (path stubs for the packages; config_clip_two.py, finetune_il.py, "
            "utils/data_manager.py stubbed; loralib 0.1.1); CLIP_TWO built without __init__; .cuda() "
            "the identity, autocast inactive on CPU tensors (float32); GradScaler replaced by its "
            "disabled form (the identity) that records the loss; the optimiser records the gradients "
            "and does not step; the network is a stub (_FeatureNet) around the official update_mlp/get_mlp"
        ),
        seed=SEED,
        sizes={
            "dim": DIM,
            "classes_per_task": LOSS_CLASSES,
            "batch0": LOSS_BATCHES[0],
            "batch1": LOSS_BATCHES[1],
        },
        tensors=tensors,
        notes=(
            "Two tasks of 3 classes in a seeded class order; per task one epoch of two batches (4, then "
            "2: the last partial batch), each with a batch of pseudo-OOD images of the same size "
            "(labelled n_t by the official code). Raw embeddings: images 2 randn (by sample id), texts a "
            "shared direction plus noise (cosines near tau = 0.8), prompt rows by class id; the aux MLP "
            "is the suite's aux_head(512, 3) seeded and made to look trained, copied into the official "
            "update_mlp's; logit_scale log(100); task 2's anchors (pre_text_features) seeded unit "
            "vectors near the old classes' texts. Per step: the loss handed to the scaler, each term, "
            "the gradients of the image and text embeddings and of the aux MLP."
        ),
    )
