"""``strategies.training.loaders``: a fast dev run (``train_batches``) caps exactly the passes
that train, said with ``data_loader(..., training=True)``, never by shuffling alone: a capped pass
is the full pass's first batches; an evaluation pass is never cut short. Every strategy's own
training loader says so (MG-CLIP's probe and visual stage, AdapterVLM's pseudo-OOD images, GR4CIL's
compensation head), and none of its evaluation loaders does."""

import dataclasses
import math
import types

import pytest
import torch

from strategies.methods.adaptervlm import AdapterVLM
from strategies.methods.gr4cil import GR4CIL
from strategies.methods.mg_clip import MGCLIP
from strategies.settings import RunSettings
from strategies.training.loaders import SeededLoaders
from tests.helpers import tiny_strategy


class Loaders(SeededLoaders):
    device, task_classes, train_mb_size, eval_mb_size = torch.device("cpu"), [], 3, 4

    def __init__(self, train_batches):
        super().__init__()
        self.cfg = types.SimpleNamespace(num_workers=0, eval_batch_size=4)
        self.settings = RunSettings(seed=0, train_batches=train_batches)
        self.adapted_dataset = torch.utils.data.TensorDataset(torch.arange(20.0))


def _batches(loader):
    return [batch[0].tolist() for batch in loader]


def test_only_training_passes_are_capped_to_the_full_passes_first_batches():
    loaders, data = Loaders(train_batches=2), torch.utils.data.TensorDataset(torch.arange(20.0))
    full = _batches(loaders.data_loader(data, 3, shuffle=True, purpose="head"))
    assert len(full) == 7  # shuffled, but not training: every batch
    assert _batches(loaders.data_loader(data, 3, shuffle=True, purpose="head", training=True)) == full[:2]
    assert len(loaders.data_loader(data, training=True)) == 2  # capped without a shuffle too
    assert len(loaders.data_loader(data)) == 5  # evaluation: the eval batch size, never capped
    assert len(Loaders(train_batches=None).data_loader(data, 3, training=True)) == 7
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
    strategy.settings = dataclasses.replace(strategy.settings, train_batches=1)
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


def _flat(loader):
    return [batch.flatten().tolist() for batch in loader]


class CountingDataset(torch.utils.data.Dataset):
    """Items ``[i]``; counts the items it was asked for."""

    def __init__(self, n):
        self.n, self.reads = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        self.reads += 1
        return torch.tensor([float(index)])


def test_an_evaluation_sets_inputs_are_loaded_once_and_replayed_unchanged_at_later_stages():
    loaders, data = Loaders(train_batches=None), CountingDataset(10)
    with loaders.keeping_inputs(data, "test"):
        first = _flat(loaders.data_loader(data))
    assert data.reads == 10 and first == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0]]
    with loaders.keeping_inputs(data, "test"):  # the next stage: nothing is read again
        assert _flat(loaders.data_loader(data)) == first and data.reads == 10
        assert len(loaders.data_loader(data)) == 3
    # outside the block, another purpose, a shuffle, a pass that trains, another dataset: loaded as ever
    other = CountingDataset(10)
    with loaders.keeping_inputs(data, "test"):
        _flat(loaders.data_loader(data, purpose="head"))
        _flat(loaders.data_loader(data, shuffle=True))
        _flat(loaders.data_loader(data, training=True))
        _flat(loaders.data_loader(other))
    _flat(loaders.data_loader(data))
    assert data.reads == 10 + 4 * 10 and other.reads == 10


def test_a_pass_cut_short_or_over_the_budget_keeps_nothing(monkeypatch):
    from strategies.training import loaders as module

    loaders, data = Loaders(train_batches=None), CountingDataset(10)
    with loaders.keeping_inputs(data, "test"):
        next(iter(loaders.data_loader(data)))  # one batch of a pass: not a whole set
        _flat(loaders.data_loader(data))
        assert data.reads == 4 + 10
        monkeypatch.setattr(module, "KEPT_INPUTS_BUDGET", 2 * 4 * 4)  # two batches of four floats
        big = CountingDataset(12)
    with loaders.keeping_inputs(big, "test"):
        _flat(loaders.data_loader(big))
        _flat(loaders.data_loader(big))
    assert big.reads == 24  # over the budget: read at every pass


@pytest.mark.slow
def test_kept_inputs_give_every_stage_the_same_scores_as_loading_them_again(tiny_stream):
    """GR4CIL over two tasks: the runner's evaluation (the test set under one key at every stage)
    scores exactly what a fresh pass without kept inputs does."""
    strategy = tiny_strategy(GR4CIL, tiny_stream)
    test = tiny_stream.test_set
    for task in range(2):
        strategy.learn(tiny_stream.train_stream[task])
        kept = strategy.evaluate_dataset(test, cache_key="test")
        assert torch.equal(kept, strategy.evaluate_dataset(test))
    assert strategy._kept_inputs[("test", strategy.cfg.eval_batch_size)][1].batches is not None
