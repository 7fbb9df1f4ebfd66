"""GR4CIL: task-specific visual LoRA, a shared anchored text LoRA, orthogonal compensation, and
routing by unified score competition (the paper's Method section and Algorithms 1-2).

Equation numbers refer to ``paper/GR4CIL.tex``; decisions the paper leaves open follow
``docs/decisions.md`` P2 and are listed under "Interpretations" below.

Per task t (``setup_task`` -> Avalanche training loop -> ``finish_task``):

* Stage 1. Train visual adapter ``visual_t`` (a copy of ``visual_{t-1}`` by default) and the
  shared ``text`` adapter with ``L_base = L_clip + lambda_anc L_anc + lambda_sep L_sep`` (eqs. 1-3),
  re-encoding the prompts of all seen classes at every step.
* Cache the anchors ``z_c`` of the task's classes and the prototypes ``p_c`` (normalised mean of
  normalised visual features under ``visual_t``, eval transform).
* Stage 2. ``U_t`` = left singular vectors of the task's text features, ``P_perp = I - U_t U_t^T``;
  a head ``W`` initialised as ``P_perp [p_c]`` is trained with ``L_comp`` (eq. 7) on
  ``W_hat = colnorm(P_perp W)``.

Inference (no task id): for every learned task tau, ``q_c = <v^tau, t_c> + beta <v^tau, w_hat_c> +
gamma <v^tau, p_c>`` for c in C^tau, and the prediction is the argmax over all seen classes.

Interpretations (also recorded in every result's ``config``):

* ``L_comp`` uses ``logit_scale * g`` (docs/decisions.md P2; the paper's eq. 7 has no scale) and ``W_hat`` is
  column-normalised after the projection (docs/decisions.md P2, authors).
* ``U_t`` keeps singular vectors with singular value above ``1e-6 * s_max`` (numerical rank).
* Unknown-aware thresholds need held-out training images; they are held out only when
  ``threshold_holdout > 0`` (the ``zeroshot`` suite), so the main CIL protocol trains on all data.
* Anchor preservation averages over the classes of tasks 1..T-1 (the "historical" classes).
* Subspace distances use the task's training images (eval transform) under its own adapter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.core.errors import UserError
from benchmarks.core.subspace import (
    directional_distance,
    energy_basis,
    joint_basis,
    orthonormal_basis,
    symmetric_distance,
)
from strategies.base import CLIPStrategy, StrategyConfig
from strategies.registry import register


# ============================================================================ the equations
def clip_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``L_clip`` (eq. 3): cross-entropy over the current task's classes, ``logits`` being
    ``logit_scale * <v, t_c>`` for normalised image and text features (``compute_logits``)."""
    return F.cross_entropy(logits, targets)


def anchor_loss(text: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """``L_anc`` (eq. 1): mean over previous classes of ``1 - cos(t_c, z_c)``."""
    return (1.0 - F.cosine_similarity(text, anchors, dim=-1)).mean()


def separation_loss(
    new_text: torch.Tensor, seen_text: torch.Tensor, new_index: torch.Tensor, tau: float
) -> torch.Tensor:
    """``L_sep`` (eq. 2): for each new class c, the mean over the other seen classes c' of
    ``max(0, cos(t_c, t_c') - tau)``, averaged over the new classes.

    ``new_index[i]`` is the row of new class i inside ``seen_text`` (so it is excluded).
    """
    cos = F.normalize(new_text, dim=-1) @ F.normalize(seen_text, dim=-1).T  # [|C^t|, |C^1:t|]
    hinge = (cos - tau).clamp(min=0.0)
    others = new_index[:, None] != torch.arange(seen_text.shape[0], device=new_index.device)[None, :]
    return ((hinge * others).sum(dim=1) / others.sum(dim=1).clamp(min=1)).mean()


def text_subspace_basis(text: torch.Tensor, rtol: float = 1e-6) -> torch.Tensor:
    """``U_t`` ``[d, r]``: left singular vectors of ``T^t = [t_c1 .. t_c|C|]`` (d x |C|) with
    non-zero singular value (Sec. "Orthogonal Compensation")."""
    u, s, _ = torch.linalg.svd(text.T.double(), full_matrices=False)
    return u[:, s > rtol * s.max()].float()


def orthogonal_projector(basis: torch.Tensor) -> torch.Tensor:
    """``P_perp = I - U U^T``: projector onto the orthogonal complement of the text subspace."""
    return torch.eye(basis.shape[0], dtype=basis.dtype, device=basis.device) - basis @ basis.T


def compensation_head(weight: torch.Tensor, projector: torch.Tensor | None) -> torch.Tensor:
    """``W_hat = colnorm(P_perp W)`` (d x |C|); ``projector=None`` is the unconstrained ablation."""
    projected = weight if projector is None else projector @ weight
    return F.normalize(projected, dim=0)


def compensation_logits(image: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """``g^t(x) = v^T W_hat`` (eq. 5)."""
    return image @ head


def compensation_loss(
    image: torch.Tensor, head: torch.Tensor, targets: torch.Tensor, logit_scale: float
) -> torch.Tensor:
    """``L_comp`` (eq. 7), on ``logit_scale * g`` as the authors scale it (docs/decisions.md P2)."""
    return F.cross_entropy(logit_scale * compensation_logits(image, head), targets)


def class_prototypes(features: torch.Tensor, labels: torch.Tensor, classes: list[int]) -> torch.Tensor:
    """``p_c = normalise(mean of normalised features of class c)``, rows in the order of ``classes``."""
    features = F.normalize(features, dim=-1)
    return F.normalize(torch.stack([features[labels == c].mean(dim=0) for c in classes]), dim=-1)


def prototype_score(image: torch.Tensor, prototypes: torch.Tensor) -> torch.Tensor:
    """``<v, p_c>``: the prototype (OOD) cue of the final score."""
    return image @ prototypes.T


def unified_scores(
    image: torch.Tensor,
    text: torch.Tensor,
    head: torch.Tensor | None,
    prototypes: torch.Tensor | None,
    beta: float,
    gamma: float,
) -> torch.Tensor:
    """``q_c = s_c + beta g_c + gamma <v, p_c>`` for the classes of one task (Sec. "Routing and
    Inference"); raw cosines, no logit scale. A missing head or prototype term contributes 0."""
    scores = image @ text.T
    if head is not None and beta:
        scores = scores + beta * compensation_logits(image, head)
    if prototypes is not None and gamma:
        scores = scores + gamma * prototype_score(image, prototypes)
    return scores


def task_msp(task_scores: torch.Tensor) -> torch.Tensor:
    """``m_t(x)``: maximum softmax probability over one task's scores ``{q_c : c in C^t}``."""
    return task_scores.softmax(dim=-1).max(dim=-1).values


def msp_threshold(msp: torch.Tensor, percentile: float) -> float:
    """``omega^t``: the ``percentile``-th percentile of held-out MSPs (5 -> 95% are accepted)."""
    return float(np.percentile(msp.double().cpu().numpy(), percentile))


def fusion_weights(task_confidence: torch.Tensor) -> torch.Tensor:
    """``alpha_t = softmax_t(r_t)`` with ``r_t = max_c <v^t, p_c>`` (eq. 8); input ``[B, T]``."""
    return task_confidence.softmax(dim=-1)


def fused_zero_shot_logits(images: torch.Tensor, text: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``q_k^fuse = sum_t alpha_t <v^t, t_k>`` (eq. 8); ``images`` ``[T, B, d]``, ``weights`` ``[B, T]``."""
    return torch.einsum("bt,tbk->bk", weights, images @ text.T)


# ============================================================================ the strategy


@dataclass
class GR4CILConfig(StrategyConfig):
    epochs: int = 70
    visual_init: Literal["previous", "fresh"] = "previous"  # "previous": the authors' code
    use_anchor_loss: bool = True
    use_separation_loss: bool = True
    lambda_anc: float = 1.0
    lambda_sep: float = 1.0
    tau: float = 0.7
    compensation: Literal["orthogonal", "unconstrained", "off"] = "orthogonal"
    compensation_init: Literal["prototype", "random"] = "prototype"
    compensation_epochs: int = 3
    training_epochs: ClassVar[tuple[str, ...]] = ("epochs", "compensation_epochs")
    compensation_lr: float = 5e-4
    use_prototype_score: bool = True
    beta: float = 0.2
    gamma: float = 0.2
    threshold_holdout: float = 0.0  # fraction of each task's training images kept for omega^t
    threshold_percentile: float = 5.0
    # Above this many seen-class prompts, the stage-1 step backpropagates through the text tower in
    # chunks of this size (same gradients, one more forward without a graph), so training memory
    # stops growing with learned tasks. "auto" sizes it for the device and the prompts' length
    # (backbone.budgets.TEXT_BACKWARD_BUDGET): on a GPU, ImageNet-1K's 1000 prompts never chunk.
    text_chunk_size: int | Literal["auto"] = "auto"
    # Deployed inference runs the T visual branches as mixed-adapter batches of at most this many
    # images (0: all branches in one forward). "auto" sizes them for the device and model
    # (backbone.budgets.ACTIVATION_BUDGET): past a device's efficient batch size a bigger forward costs
    # more per image, so on a CPU a ViT-B/16 batch of 8 already runs each branch alone.
    max_images_per_forward: int | Literal["auto"] = "auto"

    def __post_init__(self):
        super().__post_init__()
        cap = self.max_images_per_forward
        if cap != "auto" and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 0):
            raise UserError(
                f'gr4cil option max_images_per_forward={cap!r} must be "auto" or an integer >= 0 '
                "(0: all branches in one forward)"
            )
        chunk = self.text_chunk_size
        if chunk != "auto" and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
            raise UserError(f'gr4cil option text_chunk_size={chunk!r} must be "auto" or an integer >= 1')
        if not 0.0 <= self.threshold_holdout < 1.0:
            raise UserError("gr4cil option threshold_holdout must be in [0, 1)")


@dataclass
class TaskState:
    """What GR4CIL keeps of one learned task; it never changes after the task."""

    adapter: str
    class_ids: list[int]
    text_basis: torch.Tensor  # U_t, d x r
    head: torch.Tensor | None  # W_hat_t, d x |C^t|
    prototypes: torch.Tensor  # |C^t| x d
    threshold: float | None = None  # omega^t
    diagnostics: dict[str, Any] = field(default_factory=dict)


@dataclass
class GR4CILOutput:
    """``compute_logits`` -> ``compute_loss``: a stage-1 step's logits and the text features they use."""

    logits: torch.Tensor  # logit_scale * <v, t_c> over the current classes (L_clip, eq. 3)
    text: torch.Tensor  # t_c of the seen, then the current classes (L_anc, L_sep: eqs. 1-2)
    cosine: torch.Tensor  # <v, t_c> without a graph, for the modality-gap statistics


def holdout_split(targets: list[int], order: list[int], fraction: float) -> tuple[list[int], list[int]]:
    """Indices held out to set the thresholds omega^t, and those trained on: the first
    ``max(1, round(fraction * n))`` of ``order`` are held out and the rest trained on, except that a
    class never loses its last training image. An image that would leave its class without one is
    also trained on. With hundreds of images a class this never happens; with one or two (a fast
    dev run) a class would otherwise get no prototype."""
    cut = max(1, round(fraction * len(order)))
    held, trained = order[:cut], order[cut:]
    classes = {targets[i] for i in trained}
    for index in held:
        if targets[index] not in classes:
            classes.add(targets[index])
            trained = trained + [index]
    return held, trained


@register("gr4cil")
class GR4CIL(CLIPStrategy[GR4CILConfig]):
    Config = GR4CILConfig
    # per task U_t, W_hat_t, p_c and omega^t; the anchors z_c (rows follow anchor_ids)
    checkpoint_attributes = ("tasks", "anchors", "anchor_ids", "modality_gap")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.tasks: list[TaskState] = []
        self.anchor_ids: list[int] = []
        self.anchors = torch.empty(0, self.backbone.embed_dim)  # z_c, rows follow anchor_ids
        self._longest_prompt = int(self.prompt_tokens.argmax(dim=-1).max()) + 1  # tokens up to the last EOT
        self.modality_gap: list[list[dict[str, float]]] = []  # per task, per epoch
        self._holdout = None
        self._chunked_text: torch.Tensor | None = None

    # ---------------------------------------------------------------- stage 1
    def setup_task(self, task: int, classes: list[int]) -> None:
        if task == 0:
            self.add_adapter("text", tower="text")
        adapter = f"visual_{task + 1}"
        self.add_adapter(adapter, tower="visual")
        if task > 0 and self.cfg.visual_init == "previous":
            self.backbone.copy_lora(self.tasks[-1].adapter, adapter)
        self.backbone.set_adapters(visual=adapter, text="text")
        self.backbone.set_trainable([adapter, "text"])
        self.modality_gap.append([])
        # overall, positive, negative cosine sums and counts, on the device: read once per epoch
        self._gap_sums = torch.zeros(3, dtype=torch.float64, device=self.device)
        self._gap_counts = torch.zeros(3, dtype=torch.float64)

    def select_training_data(self, dataset):
        """Images held out of stage 1 to set ``omega^t`` (unknown-aware interface), only with
        ``threshold_holdout > 0``; the rest train."""
        self._holdout = None
        if self.cfg.threshold_holdout <= 0:
            return dataset
        order = torch.randperm(len(dataset)).tolist()
        targets = [int(t) for t in dataset.targets]
        held, trained = holdout_split(targets, order, self.cfg.threshold_holdout)
        self._holdout = dataset.subset(held).eval()
        return dataset.subset(trained)

    def compute_logits(self, images: torch.Tensor) -> GR4CILOutput:
        image = self.backbone.encode_image(images, normalize=True)
        # every step re-encodes the prompts of all seen classes with the current text adapter
        classes = self.seen_classes + self.current_classes
        if len(classes) <= self.text_chunk_size():
            text, self._chunked_text = self.text_features(classes), None
        else:  # encode without a graph now; ``backward`` replays the text tower chunk by chunk
            with torch.no_grad():
                self._chunked_text = self.text_features(classes).detach().requires_grad_()
            text = self._chunked_text
        cosine = image @ text[len(self.seen_classes) :].T
        return GR4CILOutput(self.backbone.logit_scale * cosine, text, cosine.detach())

    def compute_loss(self, output: GR4CILOutput, local_targets: torch.Tensor) -> torch.Tensor:
        """``L_base = L_clip + lambda_anc L_anc + lambda_sep L_sep`` (eqs. 1-3)."""
        loss = clip_loss(output.logits, local_targets)
        n_prev = len(self.seen_classes)
        text_prev, text_new = output.text[:n_prev], output.text[n_prev:]
        if self.cfg.use_anchor_loss and n_prev:
            loss = loss + self.cfg.lambda_anc * anchor_loss(
                text_prev, self.device_copy("anchors", self.anchors)
            )
        if self.cfg.use_separation_loss and (n_prev or len(self.current_classes) > 1):
            new_index = torch.arange(n_prev, n_prev + len(self.current_classes), device=text_new.device)
            loss = loss + self.cfg.lambda_sep * separation_loss(
                text_new, output.text, new_index, self.cfg.tau
            )
        self._record_gap(output.cosine, local_targets)
        return loss

    def finish_backward(self) -> None:
        """With many seen classes, finish the text tower's backward pass chunk by chunk: the loss
        gave d loss / d t_c; re-encode each chunk with a graph and push that gradient through it."""
        chunked, self._chunked_text = self._chunked_text, None
        if chunked is None or chunked.grad is None:  # not chunked, or no gradient reached the text
            return
        grad = chunked.grad
        classes = self.seen_classes + self.current_classes
        size = self.text_chunk_size()
        for start in range(0, len(classes), size):
            self.text_features(classes[start : start + size]).backward(grad[start : start + size])

    def text_chunk_size(self) -> int:
        """The resolved ``text_chunk_size``: "auto" fits the device's ``TEXT_BACKWARD_BUDGET``."""
        if self.cfg.text_chunk_size != "auto":
            return self.cfg.text_chunk_size
        return self.backbone.efficient_prompts_per_backward(self._longest_prompt)

    def _record_gap(self, cosine: torch.Tensor, targets: torch.Tensor) -> None:
        """Accumulate the modality-gap statistics of Sec. "Task-wise Inconsistency" for this epoch."""
        cosine = cosine.double()
        total = cosine.sum()
        positive = cosine.gather(1, targets[:, None]).sum()  # one positive per row; no host sync
        self._gap_sums += torch.stack([total, positive, total - positive])
        rows, n = cosine.shape[0], cosine.numel()
        self._gap_counts += torch.tensor([n, rows, n - rows], dtype=torch.float64)

    def on_epoch_end(self, epoch: int, loss: float) -> bool:
        """The epoch's modality-gap statistics (Sec. "Task-wise Inconsistency"); training goes on."""
        mean = (self._gap_sums.cpu() / self._gap_counts.clamp(min=1)).tolist()
        self.modality_gap[-1].append(
            {
                "epoch": len(self.modality_gap[-1]) + 1,
                "overall": mean[0],
                "positive": mean[1],
                "negative": mean[2],
            }
        )
        self._gap_sums.zero_()
        self._gap_counts.zero_()
        return super().on_epoch_end(epoch, loss)

    # ---------------------------------------------------------------- after stage 1, and stage 2
    def finish_task(self, task: int, classes: list[int]) -> None:
        adapter = f"visual_{task + 1}"
        with torch.no_grad():
            text = self.text_features(classes).cpu()  # T^t under the final text adapter
        self.anchor_ids += classes
        self.anchors = torch.cat([self.anchors, text])  # z_c, cached when the task ends
        features, labels = self.encode_dataset(self.adapted_dataset.eval(), adapter)
        prototypes = class_prototypes(features, labels, classes)
        basis = text_subspace_basis(text)
        head = self._train_compensation(adapter, classes, basis, prototypes)
        state = TaskState(adapter, list(classes), basis, head, prototypes)
        if self._holdout is not None:
            state.threshold = self._threshold(state, text)
        state.diagnostics = self._subspace_diagnostics(features, text, head)
        self.tasks.append(state)
        self.backbone.set_adapters(visual=adapter, text="text")

    def _train_compensation(
        self, adapter: str, classes: list[int], basis: torch.Tensor, prototypes: torch.Tensor
    ) -> torch.Tensor | None:
        """Stage 2: learn ``W_hat_t`` with eq. 7 on the frozen branch (Adam, train augmentation)."""
        if self.cfg.compensation == "off":
            return None
        projector = orthogonal_projector(basis) if self.cfg.compensation == "orthogonal" else None
        if self.cfg.compensation_init == "prototype":
            init = prototypes.T.clone()
        else:
            init = F.normalize(torch.randn(prototypes.shape[1], len(classes)), dim=0)
        if projector is not None:
            init = projector @ init
        weight = torch.nn.Parameter(init.to(self.device))
        projector = projector.to(self.device) if projector is not None else None
        self.backbone.set_adapters(visual=adapter, text="text")
        self.train_on_frozen_features(
            [weight],
            lambda image, targets: compensation_loss(
                image, compensation_head(weight, projector), targets, self.backbone.logit_scale
            ),
            epochs=self.cfg.compensation_epochs,
            lr=self.cfg.compensation_lr,
            batch_size=self.cfg.batch_size,
            purpose="compensation",
        )
        return compensation_head(weight.detach(), projector).cpu()

    def _threshold(self, state: TaskState, text: torch.Tensor) -> float:
        """``omega^t`` from the held-out images of the task (unknown-aware interface)."""
        features, _ = self.encode_dataset(self._holdout, state.adapter)
        scores = self._task_scores(features, state, text)
        return msp_threshold(task_msp(scores), self.cfg.threshold_percentile)

    def _subspace_diagnostics(self, features, text, head) -> dict[str, float | None]:
        """I-T, I-C and I-TC distances of the appendix for this task."""
        image_basis = energy_basis(features)
        text_basis = orthonormal_basis(text)
        if head is None:
            return {"I-T": directional_distance(image_basis, text_basis), "I-C": None, "I-TC": None}
        head_basis = orthonormal_basis(head.T)
        return {
            "I-T": directional_distance(image_basis, text_basis),
            "I-C": directional_distance(image_basis, head_basis),
            "I-TC": directional_distance(image_basis, joint_basis(text_basis, head_basis)),
        }

    # ---------------------------------------------------------------- inference
    def _task_scores(
        self,
        features: torch.Tensor,
        state: TaskState,
        text: torch.Tensor,
        beta: float | None = None,
        gamma: float | None = None,
    ) -> torch.Tensor:
        beta = self.cfg.beta if beta is None else beta
        gamma = (self.cfg.gamma if self.cfg.use_prototype_score else 0.0) if gamma is None else gamma
        head = state.head.to(features) if state.head is not None else None
        return unified_scores(features, text.to(features), head, state.prototypes.to(features), beta, gamma)

    def _scores_from_features(
        self, features: list[torch.Tensor], text: torch.Tensor, **weights
    ) -> torch.Tensor:
        """Scores over all seen classes from per-branch features; columns follow ``seen_classes``."""
        columns, start = [], 0
        for state, branch in zip(self.tasks, features):
            columns.append(
                self._task_scores(branch, state, text[start : start + len(state.class_ids)], **weights)
            )
            start += len(state.class_ids)
        return torch.cat(columns, dim=1)

    def images_per_forward(self) -> int:
        """The resolved ``max_images_per_forward`` (0: no cap)."""
        cap = self.cfg.max_images_per_forward
        return self.backbone.efficient_images_per_forward() if cap == "auto" else cap

    def scores(self, images: torch.Tensor) -> torch.Tensor:
        """Deployed inference: the branches in mixed-adapter batched forwards, then unified score
        competition."""
        branches = self.backbone.encode_image_multi(
            images, [s.adapter for s in self.tasks], max_images_per_forward=self.images_per_forward()
        )
        return self._scores_from_features(list(branches), self.text_features(self.seen_classes))

    def score_dataset(self, dataset, cache_key: str) -> torch.Tensor:
        """Stage-wise evaluation that reuses work: a frozen branch's features of each image are
        computed once per ``cache_key`` and kept; text features are computed once per call."""
        features = [self.frozen_features(dataset, cache_key, state.adapter) for state in self.tasks]
        text = self.text_features(self.seen_classes).cpu()
        return self._scores_from_features(features, text)

    # ---------------------------------------------------------------- unknown-aware interface
    @torch.no_grad()
    def zero_shot_text(self, text_tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        """Text features for ``zero_shot_predictions``, computed once per candidate label set K
        (``text_tokens``, one prompt per class): the original CLIP's (``clip``), the shared text
        adapter's (``shared``), and the seen classes' (``seen``, for the task MSPs)."""
        active = self.backbone.active_adapters
        prompts = self.backbone.prepare_prompts(text_tokens)
        try:
            self.backbone.set_adapters(visual=active["visual"], text=None)
            clip = self.backbone.encode_text(prompts)
            self.backbone.set_adapters(visual=active["visual"], text="text")
            return {
                "clip": clip,
                "shared": self.backbone.encode_text(prompts),
                "seen": self.text_features(self.seen_classes),
            }
        finally:
            self.backbone.set_adapters(**active)

    @torch.no_grad()
    def zero_shot_predictions(
        self, images: torch.Tensor, text: dict[str, torch.Tensor] | torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Predictions over a candidate label set K (``text`` from ``zero_shot_text``, or its tokens):

        * ``clip``: the original CLIP (both towers without adapters), the fallback predictor;
        * ``fusion``: knowledge fusion, eq. 8, ``q_k = sum_t alpha_t <v^t, t_k>`` with
          ``alpha = softmax_t(max_c <v^t, p_c>)`` and ``t_k`` from the shared text adapter;
        * ``routed``: fusion for samples every task rejects (``m_t <= omega^t``) and CLIP for the
          others (only with thresholds, i.e. ``threshold_holdout > 0``);
        * ``unknown``: the rejected-by-every-task mask.

        Scores, MSPs and thresholds are all fp32, whatever the precision of the towers.
        """
        if isinstance(text, torch.Tensor):
            text = self.zero_shot_text(text)
        adapters = [t.adapter for t in self.tasks]
        branches = self.backbone.encode_image_multi(
            images, [None, *adapters], max_images_per_forward=self.images_per_forward()
        )
        task_features = branches[1:]
        confidence = torch.stack(
            [
                prototype_score(v, t.prototypes.to(v)).max(dim=1).values
                for v, t in zip(task_features, self.tasks)
            ],
            dim=1,
        )
        out = {
            "clip": (branches[0] @ text["clip"].T).argmax(dim=1),
            "fusion": fused_zero_shot_logits(
                task_features, text["shared"], fusion_weights(confidence)
            ).argmax(dim=1),
        }
        thresholds = [t.threshold for t in self.tasks if t.threshold is not None]
        if len(thresholds) == len(self.tasks):
            scores = self._scores_from_features(list(task_features), text["seen"])
            accepted = torch.zeros(len(images), dtype=torch.bool, device=scores.device)
            start = 0
            for state, threshold in zip(self.tasks, thresholds, strict=True):
                stop = start + len(state.class_ids)
                accepted |= task_msp(scores[:, start:stop]) > threshold
                start = stop
            out["unknown"] = ~accepted
            out["routed"] = torch.where(accepted, out["clip"], out["fusion"])
        return out

    # ---------------------------------------------------------------- diagnostics (docs/decisions.md P3)
    def stage_diagnostics(self, scores, targets, task_of_class) -> dict:
        features = []
        for state in self.tasks:  # kept by the evaluation the runner has just run
            if (kept := self.cached_features("test", state.adapter)) is None:
                raise RuntimeError(f"stage_diagnostics before the test set was scored under {state.adapter}")
            features.append(kept)
        text = self.text_features(self.seen_classes).cpu()
        variants = {
            "full": torch.as_tensor(scores),
            "without_compensation": self._scores_from_features(features, text, beta=0.0),
            "text_only": self._scores_from_features(features, text, beta=0.0, gamma=0.0),
            "text_prototype": self._scores_from_features(features, text, beta=0.0),
        }
        if not self.cfg.use_prototype_score:
            variants["text_prototype"] = self._scores_from_features(
                features, text, beta=0.0, gamma=self.cfg.gamma
            )
        seen = np.asarray(self.seen_classes)
        is_seen = np.isin(targets, seen)
        column = {c: i for i, c in enumerate(self.seen_classes)}
        y = torch.as_tensor([column[int(c)] for c in targets[is_seen]])
        column_task = torch.as_tensor([task_of_class[int(c)] for c in seen])
        y_task = column_task[y]
        out: dict[str, float | None] = {}
        for name, q in variants.items():
            q = q[torch.as_tensor(is_seen)].double()
            pred_task = column_task[q.argmax(dim=1)]
            out[f"routing_acc_{name}"] = float(100.0 * (pred_task == y_task).double().mean())
            if name in ("full", "without_compensation"):
                suffix = "with_compensation" if name == "full" else "without_compensation"
                out[f"confidence_{suffix}"], out[f"margin_{suffix}"] = _confidence_and_margin(
                    q, y, y_task, column_task
                )
        return out

    def run_diagnostics(self) -> dict:
        with torch.no_grad():
            final_text = self.text_features(self.anchor_ids).cpu()
        historical = len(self.anchor_ids) - len(self.tasks[-1].class_ids)
        preservation = F.cosine_similarity(final_text, self.anchors, dim=-1)
        adjacent = list(zip(self.tasks[:-1], self.tasks[1:]))
        subspace = {
            name: _mean_or_none([t.diagnostics[name] for t in self.tasks]) for name in ("I-T", "I-C", "I-TC")
        }
        return {
            "anchor_preservation": float(preservation[:historical].mean()) if historical else None,
            "subspace_distance": subspace,
            "subspace_distance_per_task": [t.diagnostics for t in self.tasks],
            "adjacent_text_distance": _mean_or_none(
                [symmetric_distance(a.text_basis, b.text_basis) for a, b in adjacent]
            ),
            "adjacent_compensation_distance": _mean_or_none(
                [
                    symmetric_distance(orthonormal_basis(a.head.T), orthonormal_basis(b.head.T))
                    for a, b in adjacent
                    if a.head is not None and b.head is not None
                ]
            ),
            "modality_gap": self.modality_gap,
            "thresholds": [t.threshold for t in self.tasks],
            "eval_branch_forwards": self.eval_branch_forwards,
        }

    def trainable_parameter_count(self) -> int:
        """As in the appendix: text LoRA once, visual LoRAs, heads, prototypes and anchors."""
        stored = sum((t.head.numel() if t.head is not None else 0) + t.prototypes.numel() for t in self.tasks)
        return self.lora_parameter_count() + stored + self.anchors.numel()

    # ---------------------------------------------------------------- loading
    def load_checkpoint_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        super().load_checkpoint_state(tensors, meta)
        if "gr4cil" in meta:
            self._load_own_keys(tensors, meta["gr4cil"])
        if self.tasks:  # the adapters as finish_task leaves them
            self.backbone.set_adapters(visual=self.tasks[-1].adapter, text="text")

    def _load_own_keys(self, tensors: dict[str, torch.Tensor], saved: dict[str, Any]) -> None:
        """A model saved before GR4CIL used ``checkpoint_attributes`` had keys of its own: per task
        ``i`` (from 1) ``tasks/i/text_basis``, ``tasks/i/compensation_head`` (absent without a
        head), ``tasks/i/prototypes``, ``tasks/i/class_ids``; ``anchors/features`` and
        ``anchors/class_ids``; the rest under the metadata's "gr4cil"."""
        self.tasks = [
            TaskState(
                adapter=info["adapter"],
                class_ids=tensors[f"tasks/{i}/class_ids"].tolist(),
                text_basis=tensors[f"tasks/{i}/text_basis"],
                head=tensors.get(f"tasks/{i}/compensation_head"),
                prototypes=tensors[f"tasks/{i}/prototypes"],
                threshold=info["threshold"],
                diagnostics=info["diagnostics"],
            )
            for i, info in enumerate(saved["tasks"], start=1)
        ]
        self.anchors = tensors["anchors/features"]
        self.anchor_ids = tensors["anchors/class_ids"].tolist()
        self.modality_gap = saved["modality_gap"]


def _mean_or_none(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def _confidence_and_margin(
    q: torch.Tensor, y: torch.Tensor, y_task: torch.Tensor, column_task: torch.Tensor
) -> tuple[float, float | None]:
    """Mean intra-task softmax confidence of the GT class, and mean margin between the GT task's
    best score and the best score of any other task (None with a single task)."""
    in_gt_task = column_task[None, :] == y_task[:, None]
    intra = q.masked_fill(~in_gt_task, float("-inf")).softmax(dim=1)
    confidence = float(intra.gather(1, y[:, None]).mean())
    if bool(in_gt_task.all()):
        return confidence, None
    best_gt = q.masked_fill(~in_gt_task, float("-inf")).max(dim=1).values
    best_other = q.masked_fill(in_gt_task, float("-inf")).max(dim=1).values
    return confidence, float((best_gt - best_other).mean())
