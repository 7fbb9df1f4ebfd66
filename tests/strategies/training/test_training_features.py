"""``strategies.training.features``: ``frozen_features`` encodes a dataset once per (cache key,
adapter) and counts those images, ``cached_features`` reads what it kept, ``device_copy`` copies a
tensor once per new tensor, and ``encode_dataset`` gives features and labels under the adapter."""

import torch

from strategies.training.features import FeatureCaches


class Backbone:
    def __init__(self):
        self.active_adapters = {"visual": None, "text": "text"}
        self.encoded = 0

    def set_adapters(self, visual, text):
        self.active_adapters = {"visual": visual, "text": text}

    def encode_image(self, images, normalize=True):
        self.encoded += len(images)
        shift = 0.0 if self.active_adapters["visual"] is None else 1.0
        features = images + shift
        return features / features.norm(dim=-1, keepdim=True) if normalize else features


class Caches(FeatureCaches):
    device = torch.device("cpu")

    def __init__(self):
        self.backbone = Backbone()
        super().__init__()  # the caches start empty

    def data_loader(self, dataset):
        return [
            (
                torch.stack([x for x, _ in dataset[i : i + 2]]),
                torch.tensor([y for _, y in dataset[i : i + 2]]),
            )
            for i in range(0, len(dataset), 2)
        ]


DATA = [(torch.tensor([float(i), 1.0]), i % 2) for i in range(5)]


def test_encode_dataset_gives_features_and_labels_under_the_adapter_and_keeps_the_text_one():
    caches = Caches()
    features, labels = caches.encode_dataset(DATA, "visual", normalize=False)
    assert torch.equal(features, torch.stack([x + 1 for x, _ in DATA])) and labels.tolist() == [0, 1, 0, 1, 0]
    assert caches.backbone.active_adapters == {"visual": "visual", "text": "text"}


def test_frozen_features_are_encoded_once_per_key_and_adapter():
    caches = Caches()
    assert caches.cached_features("test", None) is None
    first = caches.frozen_features(DATA, "test", None)
    assert caches.frozen_features(DATA, "test", None) is first is caches.cached_features("test", None)
    assert caches.backbone.encoded == caches.eval_branch_forwards == 5
    other = caches.frozen_features(DATA, "test", "visual")  # another branch: encoded again
    assert not torch.equal(other, first) and caches.eval_branch_forwards == 10


def test_a_device_copy_is_made_once_per_new_tensor():
    caches, anchors = Caches(), torch.ones(3)
    caches.device = torch.device("meta")  # every .to makes a new tensor
    copy = caches.device_copy("anchors", anchors)
    assert copy.device.type == "meta" and caches.device_copy("anchors", anchors) is copy
    replaced = torch.zeros(4)  # a new tensor under the same name: copied again
    assert caches.device_copy("anchors", replaced).shape == (4,)
