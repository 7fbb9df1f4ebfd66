"""How faithful the pretrained tiny CLIP is as a miniature of the real setting.

    python -m benchmarks.miniature_report [--weights synthetic|PATH]

Prints, on the synthetic CIL dataset: 100-way zero-shot accuracy (overall, on the classes held
out of pretraining and on those seen in it), the modality gap (matched image-text cosine against
the cosines within each modality), and a linear probe and a nearest-class-mean classifier on the
frozen image features as the reference that adaptation can reach.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.linear_model import LogisticRegression
from torch.utils.data import Dataset

from benchmarks.backbones import TINY_MODEL, BackboneSpec, CLIPBackbone, create_clip
from benchmarks.captions import PRETRAIN_HELD_OUT, ZERO_SHOT_PROMPT
from benchmarks.datasets import ClassificationData
from benchmarks.synthetic import default_class_ids, load_synthetic
from benchmarks.transforms import eval_transform

@dataclass(frozen=True)
class ZeroShotStats:
    """Zero-shot accuracy and modality-gap statistics of one backbone on one test split."""

    accuracy: float
    accuracy_held_out: float  # classes whose combination pretraining never showed
    accuracy_seen: float
    matched_cosine: float  # image vs the prompt of its own class
    image_image_cosine: float  # distinct image pairs
    text_text_cosine: float  # distinct class prompts
    centroid_cosine: float  # mean image feature vs mean text feature


@torch.no_grad()
def encode_images(backbone: CLIPBackbone, dataset: Dataset, batch_size: int = 500) -> torch.Tensor:
    """Normalised image features of every item of ``dataset`` (PIL image, label), in order."""
    transform = eval_transform(backbone.image_size, backbone.mean, backbone.std)
    features = []
    for start in range(0, len(dataset), batch_size):
        stop = min(start + batch_size, len(dataset))
        images = torch.stack([transform(dataset[i][0]) for i in range(start, stop)])
        features.append(backbone.encode_image(images))
    return torch.cat(features)


@torch.no_grad()
def encode_prompts(backbone: CLIPBackbone, class_names: Sequence[str]) -> torch.Tensor:
    """Normalised text features of the zero-shot prompt of each class."""
    return backbone.encode_text(backbone.tokenize([ZERO_SHOT_PROMPT.format(name) for name in class_names]))


def mean_pairwise_cosine(features: torch.Tensor) -> float:
    """Mean cosine over distinct pairs of rows of L2-normalised ``features``."""
    n = len(features)
    total = features.sum(dim=0)
    return float((total @ total - n) / (n * (n - 1)))  # the Gram sum minus its unit diagonal


def zero_shot_stats(
    image_features: torch.Tensor, text_features: torch.Tensor, targets: Sequence[int], held_out: torch.Tensor
) -> ZeroShotStats:
    """Accuracy and modality gap from normalised features; ``held_out[k]`` flags class ``k``."""
    targets_t = torch.as_tensor(targets)
    correct = ((image_features @ text_features.T).argmax(dim=1) == targets_t).float()
    held = held_out[targets_t]
    return ZeroShotStats(
        accuracy=float(correct.mean()),
        accuracy_held_out=float(correct[held].mean()),
        accuracy_seen=float(correct[~held].mean()),
        matched_cosine=float((image_features * text_features[targets_t]).sum(dim=1).mean()),
        image_image_cosine=mean_pairwise_cosine(image_features),
        text_text_cosine=mean_pairwise_cosine(text_features),
        centroid_cosine=float(F.cosine_similarity(image_features.mean(0), text_features.mean(0), dim=0)),
    )


def held_out_mask(n_classes: int) -> torch.Tensor:
    """Which labels of the synthetic dataset are held out of pretraining."""
    held = set(PRETRAIN_HELD_OUT)
    return torch.tensor([c in held for c in default_class_ids(n_classes)])


def evaluate_zero_shot(backbone: CLIPBackbone, data: ClassificationData) -> ZeroShotStats:
    """Zero-shot statistics of ``backbone`` on the test split of the synthetic ``data``."""
    return zero_shot_stats(
        encode_images(backbone, data.test),
        encode_prompts(backbone, data.class_names),
        data.test_targets,
        held_out_mask(data.n_classes),
    )


def probe_accuracies(
    train_features: torch.Tensor, train_targets: Sequence[int], test_features: torch.Tensor, test_targets: Sequence[int]
) -> tuple[float, float]:
    """Test accuracy of a logistic-regression probe and of nearest class mean, both on frozen features."""
    x_train, x_test = train_features.numpy(), test_features.numpy()
    y_train, y_test = np.asarray(train_targets), np.asarray(test_targets)
    probe = LogisticRegression(C=10.0, max_iter=500).fit(x_train, y_train)
    probe_accuracy = float((probe.predict(x_test) == y_test).mean())

    means = F.normalize(torch.stack([train_features[torch.as_tensor(y_train == k)].mean(0) for k in np.unique(y_train)]))
    ncm_accuracy = float(((test_features @ means.T).argmax(1).numpy() == y_test).mean())
    return probe_accuracy, ncm_accuracy


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.miniature_report", description=__doc__.split("\n")[0])
    parser.add_argument("--weights", default="synthetic", help="pretrained tag or weight file of tiny-clip-32")
    parser.add_argument("--n-train-per-class", type=int, default=100, help="train images per class (for the probes)")
    parser.add_argument("--n-test-per-class", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic dataset")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    backbone = create_clip(BackboneSpec(TINY_MODEL, args.weights))
    data = load_synthetic(args.n_train_per_class, args.n_test_per_class, args.seed)
    test_features = encode_images(backbone, data.test)
    stats = zero_shot_stats(
        test_features, encode_prompts(backbone, data.class_names), data.test_targets, held_out_mask(data.n_classes)
    )
    probe, ncm = probe_accuracies(encode_images(backbone, data.train), data.train_targets, test_features, data.test_targets)

    n_held = int(held_out_mask(data.n_classes).sum())
    print(f"tiny-clip-32 weights={args.weights}: {data.n_classes} classes, {len(data.test)} test images")
    print(f"zero-shot accuracy      {stats.accuracy:6.1%}  (chance {1 / data.n_classes:.1%})")
    print(f"  held-out classes      {stats.accuracy_held_out:6.1%}  ({n_held} never in pretraining)")
    print(f"  seen classes          {stats.accuracy_seen:6.1%}  ({data.n_classes - n_held})")
    print(f"matched image-text cos  {stats.matched_cosine:6.3f}")
    print(f"image-image cos         {stats.image_image_cosine:6.3f}")
    print(f"text-text cos           {stats.text_text_cosine:6.3f}")
    print(f"mean image vs mean text {stats.centroid_cosine:6.3f}")
    print(f"linear probe accuracy   {probe:6.1%}  (frozen image features, {len(data.train)} train images)")
    print(f"nearest class mean      {ncm:6.1%}")
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
