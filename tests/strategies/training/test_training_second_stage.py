"""``strategies.training.second_stage``: ``train_on_frozen_features`` trains the given parameters
alone, one Adam step per batch over the task's training data (capped in a fast dev run), on
features computed without a graph, with ``lr_factor(step, total)`` scaling each step's rate."""

import types

import torch

from strategies.settings import RunSettings
from strategies.training.loaders import SeededLoaders
from strategies.training.second_stage import SecondStage


class Head(SeededLoaders, SecondStage):
    device, task_classes = torch.device("cpu"), []

    def __init__(self, train_batches=None):
        super().__init__()
        self.cfg = types.SimpleNamespace(num_workers=0, eval_batch_size=4)
        self.settings = RunSettings(seed=0, train_batches=train_batches)
        data = torch.utils.data.TensorDataset(torch.randn(10, 3), torch.arange(10) % 2)
        self.adapted_dataset = types.SimpleNamespace(train=lambda: data)
        self.tower = torch.nn.Linear(3, 3)
        self.backbone = types.SimpleNamespace(encode_image=self.tower)

    def local_targets(self, targets):
        return targets


def _train(head, epochs=2):
    weight = torch.nn.Parameter(torch.zeros(2, 3))
    factors = []

    def lr_factor(step, total):
        factors.append((step, total))
        return 1.0

    def loss(features, targets):
        assert not features.requires_grad  # the tower ran without a graph
        return torch.nn.functional.cross_entropy(features @ weight.T, targets)

    head.train_on_frozen_features(
        [weight], loss, epochs=epochs, lr=0.1, batch_size=4, purpose="head", lr_factor=lr_factor
    )
    return weight, factors


def test_the_parameters_alone_train_one_step_a_batch():
    head = Head()
    tower = [p.detach().clone() for p in head.tower.parameters()]
    weight, factors = _train(head)
    assert factors == [(step, 6) for step in range(6)]  # 2 epochs of 3 batches
    assert weight.abs().sum() > 0
    assert all(torch.equal(a, b) for a, b in zip(tower, head.tower.parameters(), strict=True))


def test_a_fast_dev_run_caps_every_pass():
    _, factors = _train(Head(train_batches=1))
    assert factors == [(0, 2), (1, 2)]
