"""iCaRL in PyCIL's shape: epochs and schedules as module constants, its own test loader,
exemplars through ``appendent``, knowledge distillation from a frozen copy of the network."""

import logging

import numpy as np
import torch.nn.functional as F
from pycil_nets.inc_net import IncrementalNet
from torch import optim
from torch.utils.data import DataLoader
from tqdm import tqdm

from pycil_learners.base import BaseLearner

init_epoch = 16
init_milestones = [8, 12]
epochs = 8
milestones = [4, 6]
lrate = 0.05
batch_size = 16
T = 2


class ICaRLLike(BaseLearner):
    def __init__(self, args):
        super().__init__(args)
        self._network = IncrementalNet(args, False)
        self.epochs_run = []  # what the test reads: the epochs each task trained
        self.test_loader_items = []  # and the items its own test loader got

    def after_task(self):
        self._old_network = self._network.copy().freeze()
        self._known_classes = self._total_classes

    def incremental_train(self, data_manager):
        self._cur_task += 1
        self._total_classes = self._known_classes + data_manager.get_task_size(self._cur_task)
        self._network.update_fc(self._total_classes)
        train = data_manager.get_dataset(
            np.arange(self._known_classes, self._total_classes),
            source="train",
            mode="train",
            appendent=self._get_memory(),
        )
        test = data_manager.get_dataset(np.arange(0, self._total_classes), source="test", mode="test")
        self.test_loader_items.append(np.asarray(test.images).copy())
        self.train_size = len(train)
        self._train(
            DataLoader(train, batch_size=batch_size, shuffle=True), DataLoader(test, batch_size=batch_size)
        )
        self.build_rehearsal_memory(data_manager, self.samples_per_class)

    def _train(self, train_loader, test_loader):
        self._network.to(self._device)
        n_epochs, steps = (init_epoch, init_milestones) if self._cur_task == 0 else (epochs, milestones)
        optimizer = optim.SGD(self._network.parameters(), lr=lrate, momentum=0.9)
        scheduler = optim.lr_scheduler.MultiStepLR(optimizer, milestones=steps, gamma=0.1)
        for _ in tqdm(range(n_epochs), desc="icarl-like"):
            self._network.train()
            for _, inputs, targets in train_loader:
                inputs, targets = inputs.to(self._device), targets.to(self._device)
                logits = self._network(inputs)["logits"]
                loss = F.cross_entropy(logits, targets)
                if self._old_network is not None:
                    old = self._old_network(inputs)["logits"]
                    loss = loss + F.kl_div(
                        F.log_softmax(logits[:, : self._known_classes] / T, 1),
                        F.softmax(old / T, 1),
                        reduction="batchmean",
                    )
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            scheduler.step()
        self.epochs_run.append(n_epochs)
        logging.info("Task %d, test accuracy %.2f", self._cur_task, self._compute_accuracy(test_loader))
