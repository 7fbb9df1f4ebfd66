"""``strategies.training.text``: text features of class lists (a template ensemble is the
renormalised mean), prompts prepared once per class list, features computed once per class list
and text adapter inside ``fixed_text``, and a relabelling benchmark's ``class_mapping`` moving
each class name (and so its prompts) to the new id."""

import types

import pytest
import torch
import torch.nn.functional as F

from benchmarks.core.errors import UserError
from strategies.training.text import TextFeatures


class Backbone:
    def __init__(self):
        self.prompts: list[str] = []
        self.prepared = self.encoded = 0
        self.active_adapters = {"text": None}
        self.active_text_context = None

    def tokenize(self, texts):
        self.prompts = list(texts)
        return torch.arange(len(texts))[:, None]

    def prepare_prompts(self, tokens):
        self.prepared += 1
        return tokens

    def encode_text(self, tokens, normalize=True):
        self.encoded += 1
        return F.normalize(torch.cat([tokens.float(), torch.ones_like(tokens, dtype=torch.float)], 1), dim=-1)


class Text(TextFeatures):
    def __init__(self, templates):
        self.backbone, self.templates = Backbone(), templates
        super().__init__(class_names=["cat", "dog", "owl"])


def test_an_ensemble_is_the_renormalised_mean_of_its_templates():
    single, ensemble = Text(["a {}."]), Text(["a {}.", "the {}."])
    assert single.backbone.prompts == ["a cat.", "a dog.", "a owl."]
    assert single.text_features([2, 0]).shape == (2, 2)
    per_template = ensemble.template_features([2, 0])
    assert per_template.shape == (2, 2, 2)  # rows 4, 5 (owl) and 0, 1 (cat)
    torch.testing.assert_close(ensemble.text_features([2, 0]), F.normalize(per_template.mean(dim=1), dim=-1))


def test_prompts_are_prepared_once_and_features_fixed_inside_fixed_text():
    text = Text(["a {}."])
    text.text_features([0, 1])
    text.text_features([0, 1])
    assert text.backbone.prepared == 1 and text.backbone.encoded == 2  # training re-encodes
    with text.fixed_text():
        first = text.text_features([0, 1])
        with text.fixed_text():  # a nested stretch keeps the outer one's features
            assert text.text_features([0, 1]) is first
        text.backbone.active_adapters = {"text": "text"}  # another adapter: encoded anew
        assert text.text_features([0, 1]) is not first
    assert text.backbone.encoded == 4 and text._fixed_text is None


def _experience(mapping):
    benchmark = types.SimpleNamespace(class_mapping=mapping)
    return types.SimpleNamespace(origin_stream=types.SimpleNamespace(benchmark=benchmark))


def test_a_class_mapping_moves_each_name_to_its_new_id():
    text = Text(["a {}."])
    text._read_class_mapping(_experience([0, 1, 2]))  # not a relabelling: nothing to do
    text.text_features([0])
    with pytest.warns(UserWarning, match="relabels its classes"):
        text._read_class_mapping(_experience([2, 0, 1]))
    assert text.class_names == ["dog", "owl", "cat"]
    assert text.backbone.prompts == ["a dog.", "a owl.", "a cat."]
    text.text_features([0])  # the prompts of the new names are prepared anew
    assert text.backbone.prepared == 2
    with pytest.raises(UserError, match="relabels 2 classes but class_names has 3"):
        text._read_class_mapping(_experience([1, 0]))
