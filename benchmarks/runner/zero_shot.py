"""Zero-shot targets (a suite's ``zero_shot_targets``): after the stream, each of the strategy's
zero-shot predictors scored on another dataset's test split.

The runner builds the target's prompts, images and loader itself, from the run's config and the
backbone it built, so it reads of the strategy only what ``strategies.contract.ZeroShotStrategy``
lists.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from tqdm.auto import tqdm

from benchmarks.backbone import CLIPBackbone
from benchmarks.core.errors import UserError
from benchmarks.data.datasets import load_zero_shot_target
from benchmarks.data.image_lists import TransformedDataset
from benchmarks.data.loaders import seeded_loader
from benchmarks.data.streams import spread_indices
from benchmarks.data.transforms import eval_transform
from benchmarks.runner.limits import RunLimits
from strategies.config import StrategyConfig
from strategies.contract import Strategy, ZeroShotStrategy


@lru_cache(maxsize=4)
def zero_shot_target(name: str, data_root: str):
    """A zero-shot target's data (its test split), loaded once per process."""
    return load_zero_shot_target(name, data_root)


@torch.no_grad()
def zero_shot_accuracy(
    strategy: Strategy,
    backbone: CLIPBackbone,
    target: str,
    data_root: str,
    *,
    limits: RunLimits,
    config: StrategyConfig,
    device: str | torch.device,
    show_progress: bool = False,
) -> dict:
    """Accuracy (%) of each of the strategy's zero-shot predictors on a target dataset's test split
    (``limits.zero_shot_images`` of it where set, spread over the classes; of its first
    ``limits.zero_shot_classes`` classes where set, the candidate label set too), with the run's
    ``backbone`` (its tokenizer and image transform), ``config`` (its prompt template, evaluation
    batch size and workers) and ``device``.

    Images are transformed in the loader's workers; the target's text features are computed once.
    """
    if not isinstance(strategy, ZeroShotStrategy):
        raise UserError(
            f"{type(strategy).__name__} is not a zero-shot strategy: it needs zero_shot_text and "
            "zero_shot_predictions (strategies.contract.ZeroShotStrategy); drop zero_shot_targets for it"
        )
    data = zero_shot_target(target, data_root)
    class_names = data.class_names[: limits.zero_shot_classes]  # the first ones: labels stay as they are
    if limits.zero_shot_images is not None or len(class_names) < data.n_classes:
        kept = {c: 0 for c in range(len(class_names))}
        data = data.subset(test=spread_indices(data.test_targets, kept, limit=limits.zero_shot_images))
    device = torch.device(device)
    tokens = backbone.tokenize([config.prompt_template.format(n) for n in class_names])
    text = strategy.zero_shot_text(tokens)
    images = TransformedDataset(data.test, eval_transform(backbone.image_size, backbone.mean, backbone.std))
    loader = seeded_loader(  # in order: no shuffle, and the eval transform draws nothing
        images,
        ("zero-shot", target),
        config.eval_batch_size,
        num_workers=config.num_workers,
        pin_memory=device.type == "cuda",
    )
    hits: dict[str, torch.Tensor] = {}
    total = 0
    for batch, labels in tqdm(loader, desc=f"zero-shot {target}", leave=False, disable=not show_progress):
        labels = labels.to(device, non_blocking=True)
        predictions = strategy.zero_shot_predictions(batch.to(device, non_blocking=True), text)
        for name, value in predictions.items():
            count = (value == labels).sum() if name != "unknown" else value.sum()
            hits[name] = hits.get(name, 0) + count  # stays on the device until the end
        total += len(labels)
    out = {name: 100.0 * int(count) / total for name, count in hits.items() if name != "unknown"}
    if "unknown" in hits:
        out["unknown_rate"] = 100.0 * int(hits["unknown"]) / total
    return {**out, "n_test": total}
