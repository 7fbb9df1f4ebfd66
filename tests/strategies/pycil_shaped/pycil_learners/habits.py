"""Learners with one habit each that the adapter must answer in one line."""

import numpy as np
import torch
from pycil_nets.inc_net import IncrementalNet, ProjectedNet

from pycil_learners.base import BaseLearner


class NeedsCuda(BaseLearner):
    """Moves its batches with ``.cuda()``, as SimpleCIL does."""

    def __init__(self, args):
        super().__init__(args)
        self._network = IncrementalNet(args, False)

    def incremental_train(self, data_manager):
        self._cur_task += 1
        self._total_classes = self._known_classes + data_manager.get_task_size(self._cur_task)
        self._network.update_fc(self._total_classes)
        torch.zeros(1).cuda()

    def after_task(self):
        self._known_classes = self._total_classes


class KeepsAGenerator(NeedsCuda):
    """Keeps state no checkpoint can hold: a generator object."""

    def incremental_train(self, data_manager):
        self._cur_task += 1
        self._total_classes = self._known_classes + data_manager.get_task_size(self._cur_task)
        self._network.update_fc(self._total_classes)
        self.draws = (x for x in np.arange(3))


class GrowsOutsideUpdateFc(BaseLearner):
    """Grows its network each task outside ``update_fc`` (``extend_task``), as C3Box's PROOF does."""

    def __init__(self, args):
        super().__init__(args)
        self._network = ProjectedNet(args, False)

    def incremental_train(self, data_manager):
        self._cur_task += 1
        self._total_classes = self._known_classes + data_manager.get_task_size(self._cur_task)
        self._network.update_fc(self._total_classes)
        self._network.extend_task(self._total_classes)

    def after_task(self):
        self._known_classes = self._total_classes


class KeepsAdaptersInAList(NeedsCuda):
    """Trains a module per task and keeps the finished ones in a plain list on its network, outside
    the network's state dict, as C3Box's EASE keeps its adapters (``backbone.adapter_list``)."""

    def __init__(self, args):
        super().__init__(args)
        self._network.finished = []  # a plain list: the network's state dict never sees these
        self._network.names_its_own = [self._network.fc]  # registered already: not counted
        # built with the network and never trained, as the first of C3Box's two CLIP copies: nothing lost
        self._network.spare = (torch.nn.Linear(2, 2), "preprocess")

    def incremental_train(self, data_manager):
        self._cur_task += 1
        self._total_classes = self._known_classes + data_manager.get_task_size(self._cur_task)
        self._network.update_fc(self._total_classes)
        self._network.names_its_own = [self._network.fc]
        adapter = torch.nn.Linear(2, 2)
        with torch.no_grad():
            adapter.weight.add_(1.0)  # "trained"
        self._network.finished.append(adapter)
