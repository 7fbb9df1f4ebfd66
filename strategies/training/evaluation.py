"""Evaluation: the runner's entry (``evaluate_dataset``) and the scores Avalanche's ``eval`` reads."""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from benchmarks.core.precision import matmul_precision
from strategies.training.host import StrategyHost


def cat_on_host(chunks: list[torch.Tensor]) -> torch.Tensor:
    """Per-batch outputs joined on their device, then copied to the CPU once: a copy per batch would
    make the host wait for the device after every batch (the same numbers either way)."""
    return torch.cat(chunks).cpu()


class Evaluation(StrategyHost):
    """Mixin of ``CLIPStrategy``. Reads ``backbone``, ``precision``, ``device``, ``scores``,
    ``score_dataset``, ``fixed_text``, ``keeping_inputs``, ``by_class_id``, ``seen_classes``,
    ``data_loader`` and ``show_progress``."""

    @torch.no_grad()
    def evaluate_dataset(self, dataset, cache_key: str | None = None) -> torch.Tensor:
        """Scores of every sample of ``dataset`` over the seen classes, ``[N, n_seen]`` fp32 on CPU:
        the entry of every evaluation, and the opening every ``score_dataset`` shares.

        The backbone is in eval mode, nothing records gradients, and text features are computed
        once for the whole pass (``fixed_text``). With a ``cache_key`` (the runner passes the same
        ``dataset`` with the same key at every stage) the strategy's ``score_dataset`` may reuse
        per-image work that cannot change, and the loaded images themselves are kept for the next
        stage (``keeping_inputs``); without one, the scores come batch by batch.
        """
        self.backbone.eval()
        with self.fixed_text(), matmul_precision(self.settings.precision, self.device):
            if cache_key is None:
                return self.score_batches(dataset)
            with self.keeping_inputs(dataset, cache_key):
                return self.score_dataset(dataset, cache_key)

    def score_batches(self, dataset) -> torch.Tensor:
        """``scores`` of every batch of ``dataset`` (eval transform), as one fp32 tensor on the CPU."""
        out = []
        batches = tqdm(
            self.data_loader(dataset), desc="eval", leave=False, disable=not self.settings.show_progress
        )
        for images, *_ in batches:
            out.append(self.scores(images.to(self.device, non_blocking=True)).float())
        return cat_on_host(out)

    def scores_by_class_id(self, images: torch.Tensor) -> torch.Tensor:
        """``scores`` laid out for Avalanche's evaluation: ``[B, n_classes]``, column ``c`` is class
        ``c`` and classes not seen yet are ``-inf``, so ``argmax`` is the predicted class id and
        Avalanche's accuracy equals the runner's (top-1 over all seen classes, no task id)."""
        return self.by_class_id(self.scores(images), self.seen_classes)

    def _before_eval(self, **kwargs):
        super()._before_eval(**kwargs)
        self._eval_text = self.fixed_text()  # the text tower does not change during ``eval``
        self._eval_text.__enter__()

    def _after_eval(self, **kwargs):
        self._eval_text.__exit__(None, None, None)
        super()._after_eval(**kwargs)
