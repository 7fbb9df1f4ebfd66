"""Pretrain the tiny open_clip CLIP contrastively on synthetic image-caption pairs.

    python -m benchmarks.miniature.pretrain [--model MODEL] [--steps N] [--batch-size B] [--seed S]
        [--out PATH] [--log-every K]

Every batch is freshly generated (``benchmarks.data.synthetic.captions``) in the "photo" domain, so
nothing is read from disk. The
defaults reproduce the shipped checkpoint ``benchmarks/assets/tiny-clip-32-synthetic.safetensors``
(fp16) and its JSON sidecar, ``--model tiny-clip-32-512`` the 512-d one beside it (and
``--model tiny-clip-32-512-h64`` its twin with 64-wide heads); the same
arguments give the same loss trajectory on every run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import open_clip
import torch
from open_clip.loss import ClipLoss
from safetensors.torch import save_file
from tqdm import tqdm

from benchmarks.backbone import SYNTHETIC_CHECKPOINTS, TINY_MODEL, encode_clip_text
from benchmarks.core.errors import CommandParser
from benchmarks.data.synthetic.captions import pretraining_rng, sample_pretraining_pairs
from benchmarks.data.transforms import CLIP_MEAN, CLIP_STD

MAX_LOGIT_SCALE = math.log(100.0)  # CLIP's clamp on the learnt temperature
# open_clip starts the learnt scale at 1/0.07 and CLIP's long training drives it to the clamp. This
# run is ~10^4 times shorter, so it starts where trained CLIP ends. Measured on this world: from
# 1/0.07 or 50 the two towers align and no modality gap forms (matched image-text cosine above the
# cosines within each modality); from 100 the gap forms as in CLIP (Liang et al., 2022).
DEFAULT_INIT_LOGIT_SCALE = 100.0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = CommandParser(prog="python -m benchmarks.miniature.pretrain", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model",
        default=TINY_MODEL,
        choices=sorted(SYNTHETIC_CHECKPOINTS),
        help="the tiny model to pretrain (its width; the same recipe for each)",
    )
    parser.add_argument("--steps", type=int, default=1300, help="optimizer steps")
    parser.add_argument("--batch-size", type=int, default=128, help="image-caption pairs per step")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (AdamW)")
    parser.add_argument(
        "--init-logit-scale",
        type=float,
        default=DEFAULT_INIT_LOGIT_SCALE,
        help="initial logit scale (learnt after)",
    )
    parser.add_argument(
        "--warmup", type=int, default=100, help="linear warm-up steps before the cosine decay"
    )
    parser.add_argument(
        "--weight-decay", type=float, default=0.1, help="AdamW weight decay on weight matrices"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the initialisation and of the data stream"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="checkpoint path (.safetensors; default: the model's shipped one)",
    )
    parser.add_argument("--log-every", type=int, default=100, help="print the mean loss every K steps")
    args = parser.parse_args(argv)
    args.out = args.out or SYNTHETIC_CHECKPOINTS[args.model]
    parser.output_file(args.out)  # before the work, not after it
    for name in ("steps", "batch_size", "threads", "log_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 < args.init_logit_scale <= 100:
        parser.error("--init-logit-scale must be in (0, 100]")
    return args


def batches(n_steps: int, batch_size: int, seed: int) -> Iterator[tuple[np.ndarray, list[str]]]:
    """``n_steps`` fresh batches of (uint8 images ``(B, 32, 32, 3)``, captions) from one seeded stream."""
    rng = pretraining_rng(seed)
    for _ in range(n_steps):
        _, images, texts = sample_pretraining_pairs(batch_size, rng)
        yield images, texts


def images_to_tensor(images: np.ndarray) -> torch.Tensor:
    """``uint8 (N, H, W, 3)`` to normalised ``float32 (N, 3, H, W)``.

    What ``transforms.eval_transform(32)`` gives on 32 px images (its resize and crop are then
    identities), without the per-image PIL round trip.
    """
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float().div_(255.0)
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (CLIP_MEAN, CLIP_STD))
    return (x - mean) / std


def build_optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW as in open_clip's trainer: no decay on gains, biases and the logit scale
    (the 0-d and 1-d tensors)."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.98), eps=1e-6)


def warmup_cosine(warmup: int, total: int) -> Any:
    """Learning-rate factor per step: linear warm-up, then cosine decay to zero."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    return factor


@contextlib.contextmanager
def _deterministic_torch(threads: int) -> Iterator[None]:
    """Fixed thread count and deterministic kernels for the duration; the caller's settings come
    back after."""
    previous_threads, previous_deterministic = (
        torch.get_num_threads(),
        torch.are_deterministic_algorithms_enabled(),
    )
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(previous_threads)
        torch.use_deterministic_algorithms(previous_deterministic)


def pretrain(args: argparse.Namespace) -> tuple[open_clip.CLIP, list[tuple[int, float]]]:
    """Train a fresh tiny CLIP; return it and the logged ``(step, mean loss since last log)`` trajectory."""
    with torch.random.fork_rng():  # seeds the initialisation without touching the caller's RNG
        torch.manual_seed(args.seed)
        model = open_clip.create_model(
            args.model, pretrained=None, init_logit_scale=math.log(args.init_logit_scale)
        )
    tokenizer = open_clip.get_tokenizer(args.model)
    model.train()
    loss_fn = ClipLoss()
    optimizer = build_optimizer(model, args.lr, args.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(args.warmup, args.steps))

    trajectory: list[tuple[int, float]] = []
    window: list[float] = []
    progress = tqdm(
        batches(args.steps, args.batch_size, args.seed), total=args.steps, desc="pretrain", unit="step"
    )
    for step, (images, texts) in enumerate(progress, start=1):
        image_features = model.encode_image(images_to_tensor(images), normalize=True)
        # one padded batch, as when the shipped checkpoint was made (buckets would round differently)
        text_features = encode_clip_text(model, tokenizer(texts), length_buckets=False)
        loss = loss_fn(image_features, text_features, model.logit_scale.exp())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0.0, MAX_LOGIT_SCALE)

        window.append(loss.item())
        if step % args.log_every == 0 or step == args.steps:
            trajectory.append((step, sum(window) / len(window)))
            window.clear()
            scale = model.logit_scale.exp().item()
            progress.write(f"step {step:5d}  loss {trajectory[-1][1]:.4f}  logit scale {scale:6.2f}")
            progress.set_postfix(loss=f"{trajectory[-1][1]:.3f}")
    return model.eval(), trajectory


def save_checkpoint(model: torch.nn.Module, path: Path, metadata: dict[str, Any]) -> None:
    """Write fp16 safetensors and a ``.json`` sidecar, each atomically (temporary file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        name: tensor.detach().to(torch.float16).contiguous() for name, tensor in model.state_dict().items()
    }
    tmp = path.with_name(path.name + ".tmp")
    save_file(state, str(tmp), metadata={"format": "pt", "model": metadata["model"]})
    os.replace(tmp, path)

    sidecar = path.with_suffix(".json")
    tmp = sidecar.with_name(sidecar.name + ".tmp")
    tmp.write_text(json.dumps(metadata, indent=2) + "\n")
    os.replace(tmp, sidecar)


def _portable(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it (no user's home in the sidecar)."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    start = time.perf_counter()
    with _deterministic_torch(args.threads):
        model, trajectory = pretrain(args)
    wall = time.perf_counter() - start
    metadata = {
        "command": "python -m benchmarks.miniature.pretrain",
        "args": {k: _portable(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "model": args.model,
        "steps": args.steps,
        "final_loss": trajectory[-1][1],  # mean over the last log window
        "logit_scale": model.logit_scale.exp().item(),
        "loss_trajectory": [[step, loss] for step, loss in trajectory],
        "torch_version": torch.__version__,
        "open_clip_version": open_clip.__version__,
        "wall_time_s": round(wall, 1),
    }
    save_checkpoint(model, args.out, metadata)
    print(
        f"saved {args.out} ({args.out.stat().st_size / 2**20:.1f} MiB) after {wall:.0f} s; "
        f"final loss {trajectory[-1][1]:.4f}"
    )


if __name__ == "__main__":
    main()
