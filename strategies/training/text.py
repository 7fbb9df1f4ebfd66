"""CLIP's text classifier: the features of every class's prompts, prepared once per class list."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from benchmarks.backbone import PreparedPrompts
from benchmarks.core.errors import UserError
from strategies.training.host import StrategyHost


class TextFeatures(StrategyHost):
    """Mixin of ``CLIPStrategy``; takes ``class_names`` (indexed by class id) and tokenises every
    class under every template. Reads ``backbone`` and ``templates`` (the prompt templates, one or
    an ensemble)."""

    def __init__(self, *, class_names: list[str], **kwargs):
        super().__init__(**kwargs)
        self._fixed_text: dict[tuple, torch.Tensor] | None = None  # inside ``fixed_text``: its memo
        self._set_class_names(class_names)

    def _set_class_names(self, names: list[str]) -> None:
        self.class_names = list(names)
        # row c * len(templates) + m is class c under template m
        self.prompt_tokens = self.backbone.tokenize([t.format(n) for n in names for t in self.templates])
        self._prepared_prompts: dict[tuple[int, ...], PreparedPrompts] = {}

    def _read_class_mapping(self, experience) -> None:
        """A benchmark that relabels its classes (``nc_benchmark(...,
        class_ids_from_zero_from_first_exp=True)``) is read through its ``class_mapping``:
        ``class_names`` name the dataset's own ids, so each name moves to its class's new id and every
        prompt still names its class."""
        benchmark = getattr(getattr(experience, "origin_stream", None), "benchmark", None)
        mapping = getattr(benchmark, "class_mapping", None)
        if not mapping or all(new in (-1, old) for old, new in enumerate(mapping)):
            return
        if len(mapping) != len(self.class_names):
            raise UserError(
                f"the benchmark relabels {len(mapping)} classes but class_names has {len(self.class_names)}; "
                "build it without class_ids_from_zero_from_first_exp, or give one name per original class"
            )
        names = list(self.class_names)
        for old, new in enumerate(mapping):
            if new >= 0:
                names[new] = self.class_names[old]
        warnings.warn(
            "the benchmark relabels its classes (class_mapping): class_names are read as the dataset's "
            "own ids and moved to the benchmark's",
            stacklevel=2,
        )
        self._set_class_names(names)

    def text_features(self, class_ids: list[int]) -> torch.Tensor:
        """Normalised fp32 text features of the classes' prompts under the active text adapter.

        The prompts are prepared (trimmed, in length buckets where that pays) once per class list,
        so a training step that re-encodes them never reads token values on the device. Inside
        ``fixed_text`` the features themselves are computed once per class list and text adapter.
        """
        key = tuple(class_ids)
        context = self.backbone.active_text_context
        memo_key = (
            key,
            self.backbone.active_adapters["text"],
            None if context is None else id(context.embeddings),
        )
        if self._fixed_text is not None and memo_key in self._fixed_text:
            return self._fixed_text[memo_key]
        features = self.template_features(class_ids)
        if features.dim() == 3:  # an ensemble: the renormalised mean of the per-template features
            features = F.normalize(features.mean(dim=1), dim=-1)
        if self._fixed_text is not None:
            self._fixed_text[memo_key] = features
        return features

    def template_features(self, class_ids: list[int]) -> torch.Tensor:
        """Normalised fp32 features of every template of the classes: ``[C, M, d]`` for an ensemble
        of M templates, ``[C, d]`` for a single template."""
        key = tuple(class_ids)
        if key not in self._prepared_prompts:
            m = len(self.templates)
            rows = [c * m + t for c in key for t in range(m)]
            self._prepared_prompts[key] = self.backbone.prepare_prompts(self.prompt_tokens[rows])
        features = self.backbone.encode_text(self._prepared_prompts[key], normalize=True)
        return features if len(self.templates) == 1 else features.view(len(key), len(self.templates), -1)

    @contextlib.contextmanager
    def fixed_text(self) -> Iterator[None]:
        """A stretch (evaluation) in which the text tower does not change: ``text_features`` is
        computed once per class list and text adapter, not once per batch. Use it without grad."""
        outer = self._fixed_text
        self._fixed_text = {} if outer is None else outer
        try:
            yield
        finally:
            self._fixed_text = outer
