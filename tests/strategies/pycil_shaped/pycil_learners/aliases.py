"""A learner that keeps aliases, as PyCIL's DER, FOSTER, BEEF, FeTrIL, IL2A, PA2S, RMM and SSRE do:
``_network_module_ptr`` is the network itself (``self._network.module`` under DataParallel), and
other attributes name a tensor held elsewhere."""

import numpy as np
import torch.nn.functional as F
from pycil_nets.inc_net import IncrementalNet
from torch import optim
from torch.utils.data import DataLoader

from pycil_learners.base import BaseLearner

epochs = 1
batch_size = 16


class KeepsAliases(BaseLearner):
    def __init__(self, args):
        super().__init__(args)
        self._network = IncrementalNet(args, False)
        self._network_module_ptr = self._network

    def incremental_train(self, data_manager):
        self._cur_task += 1
        self._total_classes = self._known_classes + data_manager.get_task_size(self._cur_task)
        self._network.update_fc(self._total_classes)
        self._fc_weight = self._network_module_ptr.fc.weight  # the parameter itself
        self._fc_values = self._network.fc.weight.data  # its memory, through another tensor
        train = data_manager.get_dataset(
            np.arange(self._known_classes, self._total_classes), source="train", mode="train"
        )
        optimizer = optim.SGD(self._network.parameters(), lr=0.05)
        for _ in range(epochs):
            self._network.train()
            for _, inputs, targets in DataLoader(train, batch_size=batch_size, shuffle=True):
                loss = F.cross_entropy(self._network(inputs)["logits"], targets)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        self._protos = self._network.fc.weight.detach().clone()
        self._protos_of_old = self._protos  # a second name for the same tensor

    def after_task(self):
        self._known_classes = self._total_classes
