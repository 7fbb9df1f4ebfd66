"""A strategy's training step described plainly for the bare reference (``benchmarks.tools.reference``),
and the reference's step measured on the same batch: what ``train_speed`` and ``pipeline_speed``
compare each strategy with.

``probe_step`` reads the strategy as it trains (``StepProbe``: the batch's local targets, the task's
prompts, its trainable set and the aten ops of its step); ``reference_steps`` times the reference's
step with that trainable set; ``reference_model`` is the bare open_clip model of a run's backbone.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.backbone.mlp_adapters import Expert, ParallelAdapter
from benchmarks.backbone.weights import shipped_checkpoint
from benchmarks.runner.run_spec import RunSpec
from benchmarks.tools import reference
from strategies.base import CLIPStrategy


def _tower_of(name: str) -> str:
    return "visual" if name.startswith("backbone.model.visual.") else "text"


def trainable_set(strategy: CLIPStrategy) -> reference.TrainableSet:
    """What ``strategy`` trains inside the backbone as it trains now, described plainly for the
    reference: LoRA on k/v (towers, rank, alpha / rank), MLP adapters (towers, bottleneck, experts
    and the router's top-k), the whole visual tower, or nothing (a forward)."""
    named = strategy.trainable_parameters()
    lora = {name: p for name, p in named.items() if ".lora_A." in name}
    if lora:
        towers = tuple(t for t in reference.TOWERS if any(_tower_of(name) == t for name in lora))
        rank = next(iter(lora.values())).shape[0]
        alpha = float(getattr(strategy.cfg, "lora_alpha", 1.0))
        return reference.TrainableSet("lora_kv", towers, rank=rank, scaling=alpha / rank)
    prefix = "backbone.mlp_adapter_modules."
    adapter_towers = {name[len(prefix) :].split(".")[0] for name in named if name.startswith(prefix)}
    if adapter_towers:
        towers = tuple(t for t in reference.TOWERS if t in adapter_towers)
        block = next(iter(strategy.backbone.mlp_adapter_modules[towers[0]].children()))
        assert isinstance(block, ParallelAdapter)  # the first block's
        expert = block.experts[0]
        assert isinstance(expert, Expert)
        return reference.TrainableSet(
            "mlp_adapter",
            towers,
            bottleneck=expert.down.out_features,
            experts=len(block.experts),
            top_k=block.router.top_k if block.router is not None else 0,
        )
    if any(name.startswith("backbone.model.visual.") for name in named):
        return reference.TrainableSet("full_visual", ("visual",))
    return reference.TrainableSet()


def task_prompts(strategy: CLIPStrategy) -> list[str]:
    """The prompts of the current task's classes, as the strategy words them."""
    template = strategy.cfg.prompt_template
    return [template.format(strategy.class_names[c]) for c in strategy.current_classes]


def strategy_step_ops(strategy: CLIPStrategy, images: torch.Tensor, targets: torch.Tensor) -> Counter:
    """The aten ops of one training step's forward and backward of ``strategy`` as it trains
    (``compute_logits``, ``compute_loss``, ``backward``; no optimiser), after one warm-up call; its
    gradients are dropped after each call, as the optimiser's ``zero_grad`` does between steps."""
    params = list(strategy.trainable_parameters().values())

    def forward_backward() -> None:
        loss = strategy.compute_loss(strategy.compute_logits(images), targets)
        if loss.requires_grad:
            loss.backward()
        for param in params:
            param.grad = None

    for param in params:
        param.grad = None
    forward_backward()
    return reference.count_aten_ops(forward_backward)


def reference_model(spec: RunSpec) -> torch.nn.Module:
    """The bare open_clip model of ``spec``'s backbone on its device: the tiny model with the
    shipped synthetic weights it trains from (for realism alone: speed does not depend on weights),
    a weight file where the run names one, else randomly initialised."""
    pretrained = spec.backbone.get("pretrained")
    weights = shipped_checkpoint(spec.backbone["model"], pretrained)
    if weights is None and pretrained and Path(str(pretrained)).expanduser().is_file():
        weights = Path(str(pretrained)).expanduser()
    return reference.load_model(spec.backbone["model"], weights, spec.device)


@dataclasses.dataclass
class StepProbe:
    """What ``probe_step`` saw in the last timed step of a strategy: the batch's local targets, the
    task's prompts, the trainable set and the aten ops of the strategy's step."""

    targets: torch.Tensor | None = None
    prompts: list[str] = dataclasses.field(default_factory=list)
    trainable: reference.TrainableSet = dataclasses.field(default_factory=reference.TrainableSet)
    ops: int | None = None
    ops_error: str | None = None


def probe_step(
    probe: StepProbe, batch: list[torch.Tensor], count_ops: bool = True
) -> Callable[[CLIPStrategy], None]:
    """A ``StepTimer.at_end`` that fills ``probe`` from the strategy as it trains (after its last
    timed step). Counting the ops runs a step's forward and backward on the strategy: only on a
    copy that is dropped afterwards (``count_ops``)."""

    def at_end(strategy: CLIPStrategy) -> None:
        probe.targets = strategy.local_targets(batch[1])
        probe.prompts = task_prompts(strategy)
        probe.trainable = trainable_set(strategy)
        if not count_ops:
            return
        try:
            probe.ops = sum(strategy_step_ops(strategy, batch[0], probe.targets).values())
        except Exception as err:  # a step that needs more than compute_logits/compute_loss: say so
            probe.ops_error = f"{type(err).__name__}: {err}".splitlines()[0]

    return at_end


def reference_steps(
    model: torch.nn.Module, spec: RunSpec, probe: StepProbe, batch, precision: str, warmup: int, steps: int
) -> tuple[dict, int]:
    """The reference's step images/s on ``batch`` with the probed trainable set (``measure_steps``)
    and the aten ops of its step's forward and backward."""
    tokens = reference.tokenize(spec.backbone["model"], probe.prompts, spec.device)
    images, targets = batch[0], probe.targets
    if targets is None:
        raise RuntimeError("no step of the strategy was probed (probe_step) before its reference")
    trainable = probe.trainable
    measured = reference.measure_steps(model, trainable, images, targets, tokens, precision, warmup, steps)
    ops = sum(reference.step_ops(model, trainable, images, targets, tokens, precision).values())
    return measured, ops
