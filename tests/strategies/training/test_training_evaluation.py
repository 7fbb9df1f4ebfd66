"""``strategies.training.evaluation``: ``evaluate_dataset`` opens every evaluation the same way
(eval mode, no gradients, text fixed) and hands a cache key to ``score_dataset``, or scores batch
by batch without one; Avalanche's ``eval`` runs with the text fixed, and ``scores_by_class_id``
lays scores out by class id for it."""

import contextlib

import torch

from strategies.settings import RunSettings
from strategies.training.evaluation import Evaluation


class Template:  # Avalanche's side of ``eval``
    def _before_eval(self, **kwargs):
        self.calls.append("avalanche before")

    def _after_eval(self, **kwargs):
        self.calls.append("avalanche after")


class Scorer(Evaluation, Template):
    settings = RunSettings(show_progress=False, precision="fp32")
    device = torch.device("cpu")

    def __init__(self):
        self.backbone = torch.nn.Linear(2, 3)
        self.seen_classes = [3, 0, 1]
        self.calls = []

    @contextlib.contextmanager
    def fixed_text(self):
        self.calls.append("fixed")
        yield
        self.calls.append("unfixed")

    @contextlib.contextmanager
    def keeping_inputs(self, dataset, cache_key):
        self.calls.append(("keeping", cache_key))
        yield

    def data_loader(self, dataset):
        return [(dataset[i : i + 2],) for i in range(0, len(dataset), 2)]

    def scores(self, images):
        self.calls.append(("scores", torch.is_grad_enabled(), self.backbone.training))
        return self.backbone(images)

    def score_dataset(self, dataset, cache_key):
        self.calls.append(("score_dataset", cache_key))
        return torch.zeros(len(dataset), 3)

    def by_class_id(self, logits, columns):
        out = torch.full((logits.shape[0], 5), float("-inf"))
        out[:, columns] = logits
        return out


def test_an_evaluation_is_opened_once_for_every_strategy():
    scorer, images = Scorer(), torch.randn(5, 2)
    scores = scorer.evaluate_dataset(images)
    assert scores.shape == (5, 3) and scores.dtype == torch.float32
    assert scorer.calls == ["fixed", *[("scores", False, False)] * 3, "unfixed"]  # eval mode, no grad
    scorer.calls.clear()
    scorer.evaluate_dataset(images, cache_key="test")
    assert scorer.calls == ["fixed", ("keeping", "test"), ("score_dataset", "test"), "unfixed"]


def test_avalanches_eval_keeps_the_text_fixed_throughout():
    scorer = Scorer()
    scorer._before_eval()
    scorer.calls.append("eval")
    scorer._after_eval()
    assert scorer.calls == ["avalanche before", "fixed", "eval", "unfixed", "avalanche after"]


def test_scores_by_class_id_put_each_seen_class_in_its_column():
    scorer, images = Scorer(), torch.randn(4, 2)
    laid_out = scorer.scores_by_class_id(images)
    assert torch.equal(laid_out[:, [3, 0, 1]], scorer.backbone(images))
    assert torch.isinf(laid_out[:, [2, 4]]).all()
