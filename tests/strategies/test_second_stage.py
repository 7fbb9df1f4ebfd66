"""``CLIPStrategy.train_on_frozen_features``, the second stage GR4CIL (compensation head, eq. 7) and
MG-CLIP (visual classifier) share: Adam on the given parameters alone, over the task's training
data under its own seeded loader, on features of the active visual branch computed without a
graph, the learning rate scaled per step."""

import pytest
import torch
import torch.nn.functional as F

from strategies.methods.continual_clip import ContinualCLIP
from tests.helpers import tiny_strategy


def _second_stage(strategy, purpose="head", lr_factor=None, epochs=2):
    """Rows of a cosine classifier trained from a seeded start; what the loss saw, batch by batch."""
    torch.manual_seed(0)
    rows = torch.nn.Parameter(torch.randn(len(strategy.current_classes), strategy.backbone.embed_dim))
    seen = []

    def loss(image, targets):
        seen.append((image, targets))
        return F.cross_entropy(image @ F.normalize(rows, dim=-1).T, targets)

    strategy.train_on_frozen_features(
        [rows], loss, epochs=epochs, lr=0.01, batch_size=16, purpose=purpose, lr_factor=lr_factor
    )
    return rows.detach(), seen


class WithSecondStage(ContinualCLIP):
    """Continual-CLIP that calls ``stage()`` after a task, where a second stage runs."""

    stage = None

    def finish_task(self, task, classes):
        self.outcome = self.stage()


@pytest.fixture
def after_task(tiny_stream):
    """``run(**options)``: ``_second_stage`` with those options at the end of a first task."""

    def run(**options):
        strategy = tiny_strategy(WithSecondStage, tiny_stream, epochs=0)
        strategy.stage = lambda: (*_second_stage(strategy, **options), strategy)
        strategy.train(tiny_stream.train_stream[0])
        return strategy.outcome

    return run


def test_only_the_given_parameters_learn_on_graph_free_features_of_the_task(after_task, tiny_stream):
    rows, seen, strategy = after_task()
    torch.manual_seed(0)
    assert not torch.equal(rows, torch.randn_like(rows))
    untouched = tiny_strategy(WithSecondStage, tiny_stream, epochs=0).backbone.state_dict()
    assert all(torch.equal(v, untouched[k]) for k, v in strategy.backbone.state_dict().items())
    images = sum(len(targets) for _, targets in seen)
    assert images == 2 * len(tiny_stream.train_stream[0].dataset)  # two passes over the task's data
    assert all(not image.requires_grad for image, _ in seen)
    targets = torch.cat([t for _, t in seen])
    assert targets.min() >= 0 and targets.max() < len(strategy.current_classes)


def test_its_draws_follow_the_purpose_and_repeat_exactly(after_task):
    once, *_ = after_task(purpose="head")
    again, *_ = after_task(purpose="head")
    other, *_ = after_task(purpose="another head")
    assert torch.equal(once, again) and not torch.equal(once, other)


def test_the_learning_rate_factor_is_asked_at_every_step_of_all_epochs(after_task, tiny_stream):
    calls = []
    after_task(lr_factor=lambda step, total: calls.append((step, total)) or 1.0, epochs=3)
    total = 3 * -(-len(tiny_stream.train_stream[0].dataset) // 16)  # batches of 16
    assert calls == [(step, total) for step in range(total)]
    unscaled, *_ = after_task(epochs=3)
    scaled, *_ = after_task(lr_factor=lambda step, total: 1.0, epochs=3)
    assert torch.equal(scaled, unscaled)  # a factor of 1 is the constant learning rate, to the bit
    frozen, *_ = after_task(lr_factor=lambda step, total: 0.0)
    torch.manual_seed(0)
    assert torch.equal(frozen, torch.randn_like(frozen))
