"""Training images per second with 0 and N data-loader workers, on the offline world.

``python -m benchmarks.tools.loader_speed [--workers 0,2] [--model tiny-clip-32] [--epochs 2] [--device cpu]``
measures, for each worker count, on the first task of the smoke stream (synthetic, 10 tasks):

* ``loader``: images/s of the suite's training loader alone (decode, augment, collate, pin), whose
  shuffle and augmentation draws are seeded per sample (``benchmarks.data.loaders``);
* ``plain loader``: the same with a plain torch ``DataLoader`` (global generator), timed in the same
  run, alternating pass by pass; ``seeding_cost`` is plain / seeded images per second;
* ``training``: images/s of ``strategy.learn`` (sequential fine-tuning, one visual and one text
  LoRA) on that task: loading and training steps together, as a run does them.

The train augmentation is the paper's (bicubic resize to the model's input, crop, flip, rotate),
so with ``--model ViT-B-16-quickgelu`` every image gets the real pipeline's 224 px work; the
tiny model's 32 px images cost little to load. Weights are random except for the tiny model's.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
from avalanche.core import SupervisedPlugin

from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
from benchmarks.core.atomic_io import write_json
from benchmarks.core.environment import seed_everything
from benchmarks.core.errors import CommandParser
from benchmarks.data.datasets import load_dataset
from benchmarks.data.streams import build_stream
from benchmarks.data.transforms import eval_transform, train_transform
from strategies.base import StrategyConfig
from strategies.methods.finetune import Finetune
from strategies.settings import RunSettings


class LoaderProbe(SupervisedPlugin):
    """Keeps the training loader that Avalanche built for the strategy (for its worker count)."""

    def __init__(self) -> None:
        super().__init__()
        self.loader = None

    def before_training_epoch(self, strategy, *args, **kwargs) -> None:
        self.loader = strategy.dataloader


def loader_workers(loader) -> int:
    """Workers of a torch DataLoader, or of one of Avalanche's multi-dataset loaders."""
    loader = getattr(loader, "loader", loader)  # a DeviceBatches wraps the DataLoader
    if isinstance(loader, torch.utils.data.DataLoader):
        return loader.num_workers
    return loader.loader_kwargs.get("num_workers", 0)


def _strategy(
    model: str,
    device: str,
    workers: int,
    epochs: int,
    batch_size: int,
    class_names: list[str],
    probe: LoaderProbe,
):
    seed_everything(0, -1)
    pretrained = "synthetic" if model == TINY_MODEL else None
    backbone = create_clip(BackboneSpec(model, pretrained), device)
    config = StrategyConfig(
        epochs=epochs, batch_size=batch_size, num_workers=workers, lora_rank=4, lora_alpha=4.0
    )
    return Finetune(
        backbone=backbone,
        class_names=class_names,
        config=config,
        settings=RunSettings(device=device, show_progress=False),
        plugins=[probe],
    )


def measure(
    model: str, workers: int, epochs: int, batch_size: int, n_train_per_class: int, device: str
) -> dict:
    """Loader-only and training throughput on task 1 of the synthetic stream with ``workers`` workers."""
    data = load_dataset("synthetic", n_train_per_class=n_train_per_class, n_test_per_class=1)
    probe = LoaderProbe()
    strategy = _strategy(model, device, workers, epochs, batch_size, data.class_names, probe)
    backbone = strategy.backbone
    stream = build_stream(
        data,
        10,
        list(range(data.n_classes)),
        train_transform(backbone.image_size, backbone.mean, backbone.std, "paper"),
        eval_transform(backbone.image_size, backbone.mean, backbone.std),
    )
    experience = stream.train_stream[0]
    dataset = experience.dataset.train()
    loaders = {
        "seeded": strategy.data_loader(dataset, batch_size, shuffle=True, passes=epochs, purpose="train"),
        "plain": torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, shuffle=True, **strategy.loader_options()
        ),
    }
    seconds = dict.fromkeys(loaders, 0.0)
    for epoch in range(epochs):  # alternate, each pass in a rotated order, so drift hits both alike
        for kind in list(loaders)[epoch % 2 :] + list(loaders)[: epoch % 2]:
            start = time.perf_counter()
            for images, *_ in loaders[kind]:
                images.to(device, non_blocking=True)
            seconds[kind] += time.perf_counter() - start
    del loaders  # their workers end with them

    start = time.perf_counter()
    strategy.learn(experience)
    if device == "cuda":
        torch.cuda.synchronize()
    training_seconds = time.perf_counter() - start
    images = epochs * len(experience.dataset)
    return {
        "workers": workers,
        "loader_workers": loader_workers(probe.loader),
        "images": images,
        "loader_images_per_second": images / seconds["seeded"],
        "plain_loader_images_per_second": images / seconds["plain"],
        "seeding_cost": seconds["seeded"] / seconds["plain"],
        "training_images_per_second": images / training_seconds,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = CommandParser(prog="python -m benchmarks.tools.loader_speed", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=TINY_MODEL)
    parser.add_argument("--workers", default="0,2", help="comma-separated worker counts (default: 0,2)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--train-per-class", type=int, default=100, help="training images per class (smoke: 100)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", help="write the measurements as JSON here")
    args = parser.parse_args(argv)
    parser.output_file(args.out)  # before the work, not after it
    counts = [int(w) for w in args.workers.split(",") if w]
    rows = [
        measure(args.model, w, args.epochs, args.batch_size, args.train_per_class, args.device)
        for w in counts
    ]
    base = rows[0]
    for row in rows:
        row["training_speedup"] = row["training_images_per_second"] / base["training_images_per_second"]
        row["loader_speedup"] = row["loader_images_per_second"] / base["loader_images_per_second"]
    results = {
        "model": args.model,
        "device": args.device,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": _cpu_count(),
        "rows": rows,
    }
    print(json.dumps(results, indent=1))
    if args.out:
        write_json(Path(args.out), results)
    return results


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


if __name__ == "__main__":
    main()
