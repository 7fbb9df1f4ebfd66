"""``speed``'s sections about every registered strategy rather than GR4CIL's fast paths: the images
each strategy's stage-wise evaluation sends through the visual tower against its limit
(``strategy_evaluation_forwards``), and MagMax's peak training memory (``magmax_training_memory``).
The module docstring of ``benchmarks.tools.speed`` says what each measures."""

from __future__ import annotations

import resource

import torch
import torch.nn.functional as F

from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
from benchmarks.backbone.full_tuning import visual_parameters
from benchmarks.data.class_orders import seeded_order
from benchmarks.data.datasets import load_dataset
from benchmarks.data.streams import build_stream
from benchmarks.data.transforms import eval_transform
from benchmarks.tools.measuring import class_names, own_strategy_class, saved_tensor_bytes
from strategies.methods.magmax import MagMax
from strategies.registry import available
from strategies.settings import RunSettings

# Each strategy's evaluation limit in visual-tower images over T stages, as (once per stream, once
# per stage) multiples of the test images: a frozen tower is needed once (Continual-CLIP, CLAP;
# APER's pretrained and adapted branches, both frozen after task 1); a prompt method needs its frozen query
# once and one prompted forward a stage; every other strategy has one visual model (or one new
# branch) per stage.
PROMPT_METHODS = frozenset({"l2p_pp", "dualprompt", "coda_prompt"})
EVALUATION_LIMIT = {
    "continual_clip": (1, 0),
    "clap": (1, 0),
    "aper_adapter": (2, 0),
    **{name: (1, 1) for name in PROMPT_METHODS},
}


# Training options that keep this count fast (the count does not depend on them), and prompt blocks
# that fit the tiny model (4 visual blocks), and fewer CODA components than its default.
QUICK_TRAINING: dict[str, dict[str, int | list[int]]] = {
    "continual_clip": {},
    "gr4cil": {"epochs": 1, "compensation_epochs": 1},
    "mg_clip": {"epochs": 1, "visual_epochs": 1},
    "dualprompt": {"epochs": 1, "e_layers": [2, 3]},
    "coda_prompt": {"epochs": 1, "prompt_layers": [0, 1, 2, 3], "components": 60},
    "clap": {"epochs": 1, "samples": 2},
}


def strategy_evaluation_forwards(n_tasks: int, per_task: int, strategies: list[str] | None = None) -> dict:
    n_classes = n_tasks * per_task
    data = load_dataset("synthetic", n_classes=n_classes, n_train_per_class=4, n_test_per_class=2)
    out = {}
    for name in strategies or available():
        torch.manual_seed(0)
        backbone = create_clip(BackboneSpec(TINY_MODEL, "synthetic"))
        transform = eval_transform(backbone.image_size, backbone.mean, backbone.std)
        stream = build_stream(data, n_tasks, seeded_order(n_classes), transform, transform)
        cls = own_strategy_class(name)
        options: dict[str, object] = {
            "batch_size": 8,
            "eval_batch_size": 64,
            **QUICK_TRAINING.get(name, {"epochs": 1}),
        }
        strategy = cls(
            backbone=backbone,
            class_names=stream.class_names,
            config=cls.Config.from_dict(options, name),
            settings=RunSettings(show_progress=False),
        )
        seen = [0]
        hook = backbone.model.visual.register_forward_hook(
            lambda _m, args, _o: seen.__setitem__(0, seen[0] + len(args[0]))
        )
        per_stage = []
        try:
            for task in range(n_tasks):
                strategy.learn(stream.train_stream[task])
                before = seen[0]
                strategy.evaluate_dataset(stream.test_set, cache_key="test")
                per_stage.append(seen[0] - before)
        finally:
            hook.remove()
        n_images = len(stream.test_set)
        once, per_stage_limit = EVALUATION_LIMIT.get(name, (0, 1))
        limit = n_images * (once + per_stage_limit * n_tasks)
        out[name] = {
            "test_images": n_images,
            "visual_images_per_stage": per_stage,
            "visual_images": sum(per_stage),
            "limit": limit,
            "over_limit": sum(per_stage) / limit,
        }
    return out


def magmax_training_memory(model: str, batch: int, device: str, precision: str, steps: int = 3) -> dict:
    def resident_bytes() -> int:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * resource.getpagesize()

    torch.manual_seed(0)
    backbone = create_clip(BackboneSpec(model, None), device)
    strategy = MagMax(
        backbone=backbone,
        class_names=class_names(10),
        config=MagMax.Config(batch_size=batch, prompt_ensemble="cifar"),
        settings=RunSettings(device=device, precision=precision, show_progress=False),
    )
    size = backbone.image_size
    images, targets = (
        torch.randn(batch, 3, size, size, device=device),
        torch.arange(batch, device=device) % 10,
    )
    strategy.setup_task(0, list(range(10)))
    params = [p for p in backbone.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.1)
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    before = resident_bytes()
    saved = [0]
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        with saved_tensor_bytes(saved):
            loss = F.cross_entropy(strategy.compute_logits(images), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
    strategy.finish_task(0, list(range(10)))  # theta_1, tau_run and the merged model
    n_params = sum(p.numel() for p in visual_parameters(backbone.model).values())
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    result = {
        "batch_size": batch,
        "steps": steps,
        "visual_parameters": n_params,
        "weights_grads_adamw_bytes": 4 * n_params * 4,  # fp32 weights, gradients, two AdamW moments
        "visual_states_bytes": 3 * n_params * 4,  # theta_0, theta_t, tau_run (CPU copies)
        "saved_activation_bytes_per_step": saved[0] // steps,
        "rss_before_training_bytes": before,
        "peak_rss_bytes": peak_rss,
        "peak_rss_over_before_bytes": peak_rss - before,
    }
    if torch.device(device).type == "cuda":
        result["cuda_peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
    return result
