"""``strategies.training.parameters``: ``trainable_parameters`` lists exactly the tensors with
``requires_grad`` that a strategy holds (the backbone's, the extra ones, attributes, modules, lists
and dicts one level down), each once, and nothing else; ``trainable_parameter_count`` counts every
optimised tensor and every LoRA adapter once over the stream."""

import torch
from torch import nn

from strategies.training.parameters import TrainableParameters


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.frozen = nn.Linear(2, 2).requires_grad_(False)
        self.lora = nn.Linear(2, 1, bias=False)

    def lora_parameters(self, name):
        return [self.lora.weight]


class Held(TrainableParameters):
    def __init__(self):
        self.backbone = self.model = Backbone()  # the model is the backbone: not listed twice
        self.adapters = {"visual": {}}
        self.optimized_parameters = {}
        self.hidden = nn.Parameter(torch.zeros(4))  # reached through extra_trainable_parameters only
        self._closure = lambda: self.hidden
        self.residual = nn.Parameter(torch.zeros(5))
        self.head = nn.Linear(3, 1)
        self.scales = [nn.Parameter(torch.ones(())), "not a tensor"]
        self.blocks = {"gate": nn.Linear(1, 1, bias=False), "bias": nn.Parameter(torch.zeros(2))}
        self.alias = self.residual  # the same tensor again: listed once
        self.frozen = nn.Parameter(torch.ones(3), requires_grad=False)
        self.leaf = torch.zeros(6, requires_grad=True)  # a plain tensor: a step's leaf, not learned
        self.nested = [[nn.Parameter(torch.zeros(7))]]  # two levels down: not looked into
        self.optimized_tensors = [nn.Parameter(torch.zeros(8))]  # the step's bookkeeping

    def extra_trainable_parameters(self):
        return [self._closure()]


def test_exactly_the_trainable_tensors_held_each_once_in_order():
    held = Held()
    named = held.trainable_parameters()
    assert list(named) == [
        "backbone.lora.weight",
        "extra_trainable_parameters.0",
        "residual",
        "head.weight",
        "head.bias",
        "scales.0",
        "blocks.gate.weight",
        "blocks.bias",
    ]
    assert named["extra_trainable_parameters.0"] is held.hidden and named["residual"] is held.residual


def test_the_count_is_every_optimised_tensor_and_adapter_once_over_the_stream():
    held = Held()
    assert held.lora_parameter_count() == held.trainable_parameter_count() == 2  # the adapter alone
    held.optimized_parameters = {name: p.numel() for name, p in held.trainable_parameters().items()}
    assert held.trainable_parameter_count() == 2 + 4 + 5 + 3 + 1 + 1 + 1 + 2
