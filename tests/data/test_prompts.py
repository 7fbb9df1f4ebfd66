"""Prompt templates and ensembles: the published lists, and the ensemble feature by hand."""

import pytest
import torch
import torch.nn.functional as F

from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
from benchmarks.core.errors import UserError
from benchmarks.data.prompts import CIFAR_TEMPLATES, imagenet_templates, templates
from strategies.methods.finetune import Finetune
from strategies.settings import RunSettings

NAMES = ["red striped triangle", "blue dotted ring", "white solid cross"]


def test_template_lists_have_their_published_sizes():
    assert len(set(CIFAR_TEMPLATES)) == 18 and len(set(imagenet_templates())) == 80
    assert all(t.count("{}") == 1 for t in (*CIFAR_TEMPLATES, *imagenet_templates()))
    assert imagenet_templates()[0] == "a bad photo of a {}."
    assert templates("", "a photo of a {}.") == ("a photo of a {}.",)
    with pytest.raises(UserError, match="prompt_ensemble"):
        templates("coco", "{}")


@pytest.mark.parametrize("ensemble", ["cifar", "imagenet"])
def test_ensemble_feature_is_the_renormalised_mean_of_template_features(ensemble):
    backbone = create_clip(BackboneSpec(TINY_MODEL, "synthetic"))
    strategy = Finetune(
        backbone=backbone,
        class_names=NAMES,
        config=Finetune.Config.from_dict({"prompt_ensemble": ensemble}),
        settings=RunSettings(show_progress=False),
    )
    with torch.no_grad():
        features = strategy.text_features([2, 0])
        per_template = strategy.template_features([2, 0])
        by_hand = []
        for name in (NAMES[2], NAMES[0]):
            each = backbone.encode_text(backbone.tokenize([t.format(name) for t in templates(ensemble, "")]))
            by_hand.append(F.normalize(each.mean(dim=0), dim=0))
    assert per_template.shape == (2, len(templates(ensemble, "")), backbone.embed_dim)
    assert torch.allclose(features, torch.stack(by_hand), atol=1e-6)
    assert torch.allclose(features.norm(dim=-1), torch.ones(2), atol=1e-6)
    single = Finetune(
        backbone=backbone,
        class_names=NAMES,
        config=Finetune.Config(),
        settings=RunSettings(show_progress=False),
    )
    with torch.no_grad():
        assert not torch.allclose(single.text_features([2, 0]), features, atol=1e-3)  # the ensemble matters
