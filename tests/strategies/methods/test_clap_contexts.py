"""CLAP's VGA context and noise by D4's rule restated for training (issue 52): training attends over
the batch as the official code does (``train_vga_context = "batch"``), evaluation over each image
alone (``vga_context = "image"``); ``eval_noise = "batch"`` draws one noise per batch, shared by its
images, in either context."""

import torch

from strategies.methods.clap import CLAP
from tests.helpers import strategy_and_stream
from tests.strategies.methods.test_clap import SUITE


def _first_task(tmp_path, **options):
    strategy, stream = strategy_and_stream(tmp_path, SUITE)
    for name, value in options.items():
        setattr(strategy.cfg, name, value)
    strategy.current_classes = stream.tasks[0]
    strategy.setup_task(0, stream.tasks[0])
    images = torch.stack([stream.test_set[i][0] for i in range(4)])
    return strategy, stream, images


def test_the_defaults_train_over_the_batch_and_evaluate_each_image_alone(tmp_path):
    strategy, stream, images = _first_task(tmp_path)
    assert (CLAP.Config().train_vga_context, CLAP.Config().vga_context) == ("batch", "image")
    strategy.vga.eval()  # no dropout: the context alone decides
    with torch.no_grad():
        image = strategy.backbone.encode_image(images, normalize=True)
        text = strategy.class_text(stream.tasks[0])
        sizes = [len(stream.tasks[0])]
        batch = strategy.adapted_text(text, image, sizes, strategy.cfg.train_vga_context)
        alone = strategy.adapted_text(text, image[:1], sizes, strategy.cfg.train_vga_context)
        assert batch.shape[0] == 1 and not torch.allclose(batch, alone)  # one context: the whole batch
        per_image = strategy.adapted_text(text, image, sizes, strategy.cfg.vga_context)
        first = strategy.adapted_text(text, image[:1], sizes, strategy.cfg.vga_context)
        torch.testing.assert_close(per_image[:1], first, atol=1e-6, rtol=0)


def test_training_uses_the_training_context(tmp_path, monkeypatch):
    strategy, stream, images = _first_task(tmp_path)
    contexts = []
    adapted_text = strategy.adapted_text
    monkeypatch.setattr(strategy, "adapted_text", lambda *a: contexts.append(a[-1]) or adapted_text(*a))
    strategy.compute_logits(images)
    strategy.finish_task(0, stream.tasks[0])
    strategy.task_classes, strategy.seen_classes = [stream.tasks[0]], list(stream.tasks[0])
    strategy.scores(images)
    assert contexts == ["batch", "image"]


def test_batch_noise_is_one_draw_per_batch_in_either_context(tmp_path):
    for context in ("image", "batch"):
        (tmp_path / context).mkdir()
        strategy, stream, images = _first_task(tmp_path / context, eval_noise="batch", vga_context=context)
        strategy.task_classes, strategy.seen_classes = [stream.tasks[0]], list(stream.tasks[0])
        same = images[:1].expand(3, -1, -1, -1)  # one image three times in a batch
        torch.manual_seed(0)
        scores = strategy.scores(same)
        # one draw shared by the batch: equal rows; per-image draws would differ
        torch.testing.assert_close(scores[1:], scores[:1].expand(2, -1), atol=1e-5, rtol=0)
        torch.manual_seed(1)
        assert not torch.allclose(strategy.scores(same), scores)  # fresh draws per batch
