"""Speed and memory of GR4CIL's evaluation, inference and training step, as ratios in one run.

``python -m benchmarks.tools.speed --model tiny-clip-32`` (and ``--model ViT-B-16-quickgelu`` for a
randomly initialised ViT-B/16) measures, on whatever device is given:

1. stage-wise evaluation of a T-task stream: branch forwards and time with cached frozen-branch
   features versus recomputing every branch at every stage;
2. deployed inference: T visual branches in mixed-adapter batched forwards (GR4CIL's default
   cap on images per forward, and uncapped: one forward) versus T plain forwards;
3. the stage-1 step at the last task (all seen prompts re-encoded, anchor and separation losses)
   versus a bare single-LoRA step (current prompts, CLIP loss only), whose text pass is either
   open_clip's own (``model.encode_text``: all 77 positions, one row per prompt) or this suite's
   trimmed, prefix-sharing pass (the stricter reference: the same savings on both sides);
4. activation memory saved for backward in the stage-1 step at the first and the last task, and
   with many classes (chunked text backward);
5. the text pass of a stage-1 step with all 1000 ImageNet-1K prompts (forward and backward):
   compact (length buckets, shared prefix once) versus one batch trimmed after the longest prompt
   versus open_clip's 77 positions (``backbone.budgets.use_compact_text`` picks by device and size);
6. ``strategies``: for every registered strategy, the images its stage-wise evaluation sends
   through the visual tower over a T-task stream (each strategy trained for one epoch on the
   offline synthetic world), against the limit: each visual model once per image, i.e. T x images
   for strategies whose visual model changes or grows a branch each task, and images once for a
   frozen tower (Continual-CLIP);
7. ``magmax_memory``: MagMax's peak training memory (full fine-tuning of the visual tower) at
   ``--batch-size``: the process's peak resident memory during a few training steps over the
   resident memory before them, with the tensors it holds (weights, gradients, AdamW state, the
   pretrained, current and merged visual states). Run it alone (``--only magmax_memory``) on a CPU.

Sections 6 and 7 are ``benchmarks.tools.strategy_costs``'s, the timing and memory primitives
``benchmarks.tools.measuring``'s.

``--train`` measures something else, with options of its own (``--train --help``): every strategy's
training and evaluation images per second against a bare open_clip reference
(``benchmarks.tools.train_speed``).

Class names are ImageNet-1K's (the suite ships them): real names differ in length, as they do in
the real runs. Weights are random: speed does not depend on them. ``--precision`` (default: fp16
on CUDA, fp32 on CPU) is the towers' autocast; equalities are checked to that precision's
tolerance. Results print as JSON and go to ``--out``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from benchmarks.backbone import BackboneSpec, create_clip
from benchmarks.core.atomic_io import write_json
from benchmarks.core.errors import CommandParser
from benchmarks.core.precision import PRECISIONS, resolve_precision
from benchmarks.tools.measuring import class_names, interleaved, median_ratio, saved_tensor_bytes
from benchmarks.tools.strategy_costs import magmax_training_memory, strategy_evaluation_forwards
from strategies.methods.gr4cil import GR4CIL, TaskState
from strategies.settings import RunSettings

# Largest |difference| allowed between two computations of the same scores or features: fp32
# rounding, or about ten units of the half format's rounding (eps/2: fp16 4.9e-4, bf16 3.9e-3).
TOLERANCE = {"fp32": 1e-4, "fp16": 5e-3, "bf16": 4e-2}
CHUNK = 256  # text_chunk_size of the many-classes memory measurement


def _strategy(model: str, n_classes: int, device: str, precision: str, **config) -> GR4CIL:
    torch.manual_seed(0)
    backbone = create_clip(BackboneSpec(model, None), device)
    return GR4CIL(
        backbone=backbone,
        class_names=class_names(n_classes),
        config=GR4CIL.Config(**config),
        settings=RunSettings(device=device, precision=precision, show_progress=False),
    )


def _learned_tasks(strategy: GR4CIL, n_tasks: int, per_task: int) -> list[TaskState]:
    """Fabricate T learned tasks: adapters with random non-zero weights, heads and prototypes."""
    d = strategy.backbone.embed_dim
    states = []
    for t in range(n_tasks):
        if t == 0:
            strategy.add_adapter("text", "text")
        adapter = f"visual_{t + 1}"
        strategy.add_adapter(adapter, "visual")
        for p in strategy.backbone.lora_parameters(adapter):
            torch.nn.init.normal_(p, std=0.02)
        classes = list(range(t * per_task, (t + 1) * per_task))
        basis = torch.linalg.qr(torch.randn(d, per_task))[0]
        states.append(
            TaskState(
                adapter,
                classes,
                basis,
                F.normalize(torch.randn(d, per_task), dim=0),
                F.normalize(torch.randn(per_task, d), dim=1),
            )
        )
    strategy.backbone.set_adapters(visual=None, text="text")
    strategy.backbone.eval()
    return states


def evaluation_reuse(
    model: str, n_tasks: int, per_task: int, n_images: int, device: str, precision: str
) -> dict:
    strategy = _strategy(model, n_tasks * per_task, device, precision, eval_batch_size=64)
    states = _learned_tasks(strategy, n_tasks, per_task)
    size = strategy.backbone.image_size
    data = TensorDataset(torch.randn(n_images, 3, size, size), torch.zeros(n_images, dtype=torch.long))
    cached_time = recomputed_time = max_difference = 0.0
    recomputed_forwards = 0
    for stage in range(1, n_tasks + 1):
        strategy.tasks = states[:stage]
        strategy.seen_classes = [c for s in states[:stage] for c in s.class_ids]
        start = time.perf_counter()
        cached = strategy.evaluate_dataset(data, cache_key="test")
        cached_time += time.perf_counter() - start
        start = time.perf_counter()
        recomputed = strategy.evaluate_dataset(data)  # no cache: every branch at every stage
        recomputed_time += time.perf_counter() - start
        recomputed_forwards += stage * n_images
        max_difference = max(max_difference, float((cached - recomputed).abs().max()))
        torch.testing.assert_close(cached, recomputed, atol=TOLERANCE[precision], rtol=0)
    cached_forwards = strategy.eval_branch_forwards
    return {
        "branches_x_images": n_tasks * n_images,
        "cached_forwards": cached_forwards,
        "max_score_difference": max_difference,
        "recomputed_forwards": recomputed_forwards,
        "cached_over_branches_x_images": cached_forwards / (n_tasks * n_images),
        "forward_reduction": recomputed_forwards / cached_forwards,
        "time_reduction": recomputed_time / cached_time,
    }


def deployed_inference(
    model: str, n_tasks: int, batch: int, device: str, precision: str, repeats: int
) -> dict:
    strategy = _strategy(model, n_tasks, device, precision)
    states = _learned_tasks(strategy, n_tasks, 1)
    backbone = strategy.backbone
    size = backbone.image_size
    images = torch.randn(batch, 3, size, size, device=device)
    adapters = [s.adapter for s in states]

    def plain_forwards():  # each branch alone, under its own adapter
        for adapter in adapters:
            backbone.set_adapters(visual=adapter, text=None)
            backbone.encode_image(images)

    cap = strategy.images_per_forward()
    with torch.no_grad():
        for batched in (
            backbone.encode_image_multi(images, adapters, max_images_per_forward=cap),
            backbone.encode_image_multi(images, adapters),
        ):
            for adapter, features in zip(adapters, batched):
                backbone.set_adapters(visual=adapter, text=None)
                torch.testing.assert_close(
                    features, backbone.encode_image(images), atol=TOLERANCE[precision], rtol=0
                )
        times = interleaved(
            {
                "plain": plain_forwards,
                "batched": lambda: backbone.encode_image_multi(images, adapters, max_images_per_forward=cap),
                "one_forward": lambda: backbone.encode_image_multi(images, adapters),
            },
            repeats,
        )
    seconds = {name: statistics.median(t) for name, t in times.items()}
    return {
        "plain_seconds": seconds["plain"],
        "batched_seconds": seconds["batched"],
        "max_images_per_forward": cap,
        "batched_over_plain": median_ratio(times["batched"], times["plain"]),
        "one_forward_seconds": seconds["one_forward"],
        "one_forward_over_plain": median_ratio(times["one_forward"], times["plain"]),
    }


def _stage1_step(strategy: GR4CIL, images, targets, saved: list[int]):
    strategy.backbone.zero_grad(set_to_none=True)
    with saved_tensor_bytes(saved):
        logits = strategy.compute_logits(images)
        strategy.loss = strategy.compute_loss(logits, targets)
    strategy.backward()


def training_step(
    model: str, n_tasks: int, per_task: int, batch: int, device: str, precision: str, repeats: int
) -> dict:
    strategy = _strategy(
        model, 1000, device, precision
    )  # every ImageNet name: the many-classes row uses them
    strategy.setup_task(0, list(range(per_task)))
    strategy.backbone.train()
    size = strategy.backbone.image_size
    images = torch.randn(batch, 3, size, size, device=device)
    targets = torch.randint(0, per_task, (batch,), device=device)
    d = strategy.backbone.embed_dim

    def at_task(t: int):
        strategy.seen_classes = list(range(t * per_task))
        strategy.current_classes = list(range(t * per_task, (t + 1) * per_task))
        strategy.anchors = F.normalize(torch.randn(len(strategy.seen_classes), d), dim=1)

    clip = strategy.backbone.model

    def open_clip_text(classes: list[int]) -> torch.Tensor:  # open_clip's own pass: all 77 positions
        with strategy.backbone.autocast():
            return clip.encode_text(strategy.prompt_tokens[classes].to(device), normalize=True).float()

    def bare_step(encode_text: Callable[[list[int]], torch.Tensor]):
        """One visual and one text LoRA, the current task's prompts, CLIP loss only."""
        strategy.backbone.zero_grad(set_to_none=True)
        image = strategy.backbone.encode_image(images)
        text = encode_text(strategy.current_classes)
        F.cross_entropy(strategy.backbone.logit_scale * image @ text.T, targets).backward()

    memory = {}
    at_task(n_tasks - 1)
    with torch.no_grad():  # both text passes give the same features; only their cost differs
        torch.testing.assert_close(
            open_clip_text(strategy.current_classes),
            strategy.text_features(strategy.current_classes),
            atol=TOLERANCE[precision],
            rtol=0,
        )
    times = interleaved(
        {
            "gr4cil": lambda: _stage1_step(strategy, images, targets, [0]),
            "bare_open_clip": lambda: bare_step(open_clip_text),
            "bare_trimmed": lambda: bare_step(strategy.text_features),
        },
        repeats,
    )
    for name, task in (("first_task", 0), ("last_task", n_tasks - 1)):
        at_task(task)
        saved = [0]
        _stage1_step(strategy, images, targets, saved)
        memory[name] = saved[0]
    # many classes: ImageNet-1K's 1000 prompts, backpropagated in chunks, keep activations bounded
    many = 1000 - per_task
    strategy.cfg.text_chunk_size = CHUNK
    strategy.seen_classes, strategy.current_classes = list(range(many)), list(range(many, many + per_task))
    strategy.anchors = F.normalize(torch.randn(many, d), dim=1)
    saved = [0]
    _stage1_step(strategy, images, targets, saved)
    memory[f"1000_classes_chunks_of_{CHUNK}"] = saved[0]
    seconds = {name: statistics.median(t) for name, t in times.items()}
    return {
        "gr4cil_step_seconds": seconds["gr4cil"],
        "bare_open_clip_step_seconds": seconds["bare_open_clip"],
        "bare_trimmed_step_seconds": seconds["bare_trimmed"],
        "gr4cil_over_bare_open_clip": median_ratio(times["gr4cil"], times["bare_open_clip"]),
        "gr4cil_over_bare_trimmed": median_ratio(times["gr4cil"], times["bare_trimmed"]),
        "saved_activation_bytes": memory,
        "last_over_first_task_memory": memory["last_task"] / memory["first_task"],
    }


def text_batching(model: str, n_classes: int, device: str, precision: str, repeats: int) -> dict:
    """The text pass of a stage-1 step over ``n_classes`` ImageNet prompts, forward and backward
    through the text LoRA: compact (length buckets, shared prefix run once), one batch trimmed
    after the longest prompt, and open_clip's own pass over all 77 positions."""
    strategy = _strategy(model, n_classes, device, precision)
    strategy.add_adapter("text", "text")
    backbone = strategy.backbone
    backbone.set_adapters(visual=None, text="text")
    backbone.set_trainable(["text"])
    backbone.train()
    tokens = strategy.prompt_tokens
    compact, one_batch = (
        backbone.prepare_prompts(tokens, compact=True),
        backbone.prepare_prompts(tokens, compact=False),
    )
    lengths = tokens.argmax(dim=-1) + 1
    with torch.no_grad():
        torch.testing.assert_close(
            backbone.encode_text(compact), backbone.encode_text(one_batch), atol=TOLERANCE[precision], rtol=0
        )

    def step(encode):
        backbone.zero_grad(set_to_none=True)
        encode().sum().backward()

    def open_clip_77():
        with backbone.autocast():
            return backbone.model.encode_text(tokens.to(device), normalize=True).float()

    times = interleaved(
        {
            "compact": lambda: step(lambda: backbone.encode_text(compact)),
            "one_batch": lambda: step(lambda: backbone.encode_text(one_batch)),
            "open_clip": lambda: step(open_clip_77),
        },
        repeats,
    )
    return {
        "prompts": n_classes,
        "buckets": len(compact.buckets),
        "padding_fraction": 1.0 - float(lengths.sum()) / (n_classes * int(lengths.max())),
        "device_uses": "compact" if len(backbone.prepare_prompts(tokens).buckets) > 1 else "one_batch",
        **{f"{name}_seconds": statistics.median(t) for name, t in times.items()},
        "compact_over_one_batch": median_ratio(times["compact"], times["one_batch"]),
        "one_batch_over_open_clip": median_ratio(times["one_batch"], times["open_clip"]),
    }


SECTIONS = ("evaluation", "inference", "training_step", "text", "strategies", "magmax_memory")
DEFAULT_SECTIONS = SECTIONS[:5]  # magmax_memory reads the process's peak memory: run it alone


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    if "--train" in argv:  # training throughput against its ceilings: its own module and options
        from benchmarks.tools import train_speed

        return train_speed.main([arg for arg in argv if arg != "--train"])
    parser = CommandParser(
        prog="python -m benchmarks.tools.speed",
        description=__doc__.split("\n")[0],
        epilog="--train: training throughput against its ceilings (see --train --help)",
    )
    parser.add_argument("--model", default="tiny-clip-32")
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--classes-per-task", type=int, default=10)
    parser.add_argument("--test-images", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--precision",
        default="auto",
        choices=["auto", *PRECISIONS],
        help="the towers' autocast; default: fp16 on CUDA, fp32 on CPU",
    )
    parser.add_argument(
        "--text-prompts",
        type=int,
        default=1000,
        help="prompts in the text section (default: ImageNet-1K's 1000)",
    )
    parser.add_argument(
        "--only",
        choices=SECTIONS,
        action="append",
        help="measure only this section (repeatable); default: all but magmax_memory",
    )
    parser.add_argument(
        "--strategies",
        type=lambda text: text.split(","),
        help="comma-separated strategies of the strategies section (default: all registered)",
    )
    parser.add_argument("--out", help="write the measurements as JSON here")
    args = parser.parse_args(argv)
    parser.output_file(args.out)  # before the work, not after it
    precision = resolve_precision(args.precision, args.device)
    measure = {
        "evaluation": lambda: evaluation_reuse(
            args.model, args.tasks, args.classes_per_task, args.test_images, args.device, precision
        ),
        "inference": lambda: deployed_inference(
            args.model, args.tasks, args.batch_size, args.device, precision, args.repeats
        ),
        "training_step": lambda: training_step(
            args.model,
            args.tasks,
            args.classes_per_task,
            args.batch_size,
            args.device,
            precision,
            args.repeats,
        ),
        "text": lambda: text_batching(args.model, args.text_prompts, args.device, precision, args.repeats),
        "strategies": lambda: strategy_evaluation_forwards(
            args.tasks, args.classes_per_task, args.strategies
        ),
        "magmax_memory": lambda: magmax_training_memory(args.model, args.batch_size, args.device, precision),
    }
    results = {
        "model": args.model,
        "device": args.device,
        "precision": precision,
        "torch_threads": torch.get_num_threads(),
        "batch_size": args.batch_size,
        "repeats": args.repeats,
    }
    for section in args.only or DEFAULT_SECTIONS:
        results[section] = measure[section]()
    print(json.dumps(results, indent=1))
    if args.out:
        write_json(Path(args.out), results)
    return results


if __name__ == "__main__":
    main()
