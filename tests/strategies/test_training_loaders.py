"""``strategies.training.loaders``: a fast dev run (``max_train_batches``) caps exactly the passes
that train, said with ``data_loader(..., training=True)``, never by shuffling alone: a capped pass
is the full pass's first batches; an evaluation pass is never cut short. Every strategy's own
training loader says so (MG-CLIP's probe and visual stage, AdapterVLM's pseudo-OOD images, GR4CIL's
compensation head), and none of its evaluation loaders does."""

import math
import types

import pytest
import torch

from strategies.adaptervlm import AdapterVLM
from strategies.gr4cil import GR4CIL
from strategies.mg_clip import MGCLIP
from strategies.training.loaders import SeededLoaders
from tests.helpers import tiny_strategy


class Loaders(SeededLoaders):
    device, seed, task_classes, train_mb_size, eval_mb_size = torch.device("cpu"), 0, [], 3, 4

    def __init__(self, max_train_batches):
        self.cfg = types.SimpleNamespace(num_workers=0, eval_batch_size=4)
        self.max_train_batches = max_train_batches
        self.adapted_dataset = torch.utils.data.TensorDataset(torch.arange(20.0))


def _batches(loader):
    return [batch[0].tolist() for batch in loader]


def test_only_training_passes_are_capped_to_the_full_passes_first_batches():
    loaders, data = Loaders(max_train_batches=2), torch.utils.data.TensorDataset(torch.arange(20.0))
    full = _batches(loaders.data_loader(data, 3, shuffle=True, purpose="head"))
    assert len(full) == 7  # shuffled, but not training: every batch
    assert _batches(loaders.data_loader(data, 3, shuffle=True, purpose="head", training=True)) == full[:2]
    assert len(loaders.data_loader(data, training=True)) == 2  # capped without a shuffle too
    assert len(loaders.data_loader(data)) == 5  # evaluation: the eval batch size, never capped
    assert len(Loaders(max_train_batches=None).data_loader(data, 3, training=True)) == 7
    loaders.make_train_dataloader()
    assert len(loaders.dataloader) == 2  # Avalanche's training loader: a training pass
    loaders.make_eval_dataloader()
    assert len(loaders.dataloader) == 5


@pytest.mark.parametrize(
    ("cls", "config", "trains"),
    [
        (MGCLIP, {"epochs": "auto", "probe_epochs": 2, "visual_epochs": 1}, {"probe", "visual-classifier"}),
        (AdapterVLM, {}, {"pseudo-ood"}),
        (GR4CIL, {"compensation_epochs": 1}, {"compensation"}),
    ],
)
def test_every_strategy_loader_that_trains_says_so(tiny_stream, cls, config, trains):
    strategy = tiny_strategy(cls, tiny_stream, **config)
    strategy.max_train_batches = 1
    made = []
    real = strategy.data_loader

    def recording(dataset, batch_size=None, shuffle=False, passes=1, purpose="eval", **kwargs):
        loader = real(dataset, batch_size, shuffle, passes, purpose, **kwargs)
        made.append(
            (purpose, len(loader), math.ceil(len(dataset) / (batch_size or strategy.cfg.eval_batch_size)))
        )
        return loader

    strategy.data_loader = recording
    strategy.learn(tiny_stream.train_stream[0])
    assert {purpose for purpose, _, _ in made} >= trains
    for purpose, batches, full in made:
        assert batches == (1 if purpose in trains else full), purpose
