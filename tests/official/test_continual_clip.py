"""Continual-CLIP against its official code, by execution: the fixture of
``tests/official/goldens/continual_clip_repo.py`` (the official ``ClassIncrementalCLIP``
with OpenAI's CLIP class holding the tiny CLIP's weights, on seeded image features) fed to the suite's
``ContinualCLIP`` on the same tiny CLIP, with its CIFAR-100 protocol (template, names, DyTox order)."""

import pytest
import torch
import torch.nn.functional as F

from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
from benchmarks.data.protocols import SOURCES
from benchmarks.data.units.cifar100 import CIFAR100_CLASSES, DYTOX_CIFAR100_ORDER
from strategies.methods.continual_clip import ContinualCLIP
from strategies.settings import RunSettings
from tests.official.goldens.golden import load_golden

TEXT_ATOL = 1e-6  # float32 rounding of unit-norm features (OpenAI's text transformer runs length-first;
# seen: 6e-8)
LOGIT_ATOL = 1e-4  # logits are 90 x cosines (|logit| < 16): float32 rounding of the features, times 90
# (seen: 4e-6)
PROB_ATOL = 2e-6  # softmax of those logits: probabilities in [0, 1] (seen: 4e-7)


def _close(name: str, ours: torch.Tensor, theirs: torch.Tensor, atol: float) -> None:
    ours = ours.detach().float()
    assert ours.shape == theirs.shape, (name, ours.shape, theirs.shape)
    diff = (ours - theirs).abs().max().item()
    assert diff <= atol, f"{name}: max |suite - official| = {diff:.3g} > {atol:g}"


@pytest.fixture(scope="module")
def golden():
    return load_golden("continual_clip.zero_shot")


@pytest.fixture(scope="module")
def strategy():
    """The suite's Continual-CLIP on the tiny CLIP with the CIFAR-100 protocol of its source: the
    template of benchmarks/data/protocols.py and torchvision's names as they are. The image
    features are the fixture's (the visual tower is not compared)."""
    protocol = SOURCES["continual_clip"]["cifar100"]
    assert protocol.dataset_options == {"class_names": "torchvision"}
    config = ContinualCLIP.Config(prompt_template=protocol.prompt_template)
    backbone = create_clip(BackboneSpec(TINY_MODEL, "synthetic"))
    backbone.encode_image = lambda images, normalize=True: (
        F.normalize(images, dim=-1) if normalize else images
    )
    return ContinualCLIP(
        backbone=backbone,
        class_names=list(CIFAR100_CLASSES),
        config=config,
        settings=RunSettings(show_progress=False),
    )


def test_class_order_and_prompt_tokens_equal_the_official(golden, strategy):
    tensors, meta = golden
    order = tensors["input.class_order"].tolist()
    assert order == list(DYTOX_CIFAR100_ORDER)
    assert strategy.templates == ("a bad photo of a {}.",) and "'a bad photo of a {}.'" in meta["notes"]
    assert torch.equal(strategy.prompt_tokens[order], tensors["output.tokens"])  # one template: row c


def test_text_features_equal_the_official(golden, strategy):
    tensors, _ = golden
    order = tensors["input.class_order"].tolist()
    with torch.no_grad():
        ours = strategy.text_features(order)
    _close("text features", ours, F.normalize(tensors["output.text_features"], dim=-1), TEXT_ATOL)


def test_scores_after_every_task_equal_the_official(golden, strategy):
    tensors, meta = golden
    order, size = tensors["input.class_order"].tolist(), meta["sizes"]["increment"]
    assert strategy.backbone.logit_scale == pytest.approx(tensors["output.logit_scale"].item(), rel=1e-6)
    for task in range(meta["sizes"]["tasks"]):
        strategy.seen_classes = order[: size * (task + 1)]
        with torch.no_grad():
            logits = strategy.backbone.logit_scale * strategy.scores(tensors["input.image"])
        _close(f"logits after task {task + 1}", logits, tensors[f"output.logits.task{task}"], LOGIT_ATOL)
        _close(
            f"probs after task {task + 1}", logits.softmax(-1), tensors[f"output.probs.task{task}"], PROB_ATOL
        )
        assert torch.equal(logits.argmax(-1), tensors[f"output.probs.task{task}"].argmax(-1))
