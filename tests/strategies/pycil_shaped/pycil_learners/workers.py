"""A learner whose loaders take their worker count from a module constant, as PyCIL's do
(``num_workers = 8`` in every ``models/*.py``)."""

import numpy as np
from pycil_nets.inc_net import IncrementalNet
from torch.utils.data import DataLoader

from pycil_learners.base import BaseLearner

num_workers = 8
batch_size = 16


class EightWorkers(BaseLearner):
    def __init__(self, args):
        super().__init__(args)
        self._network = IncrementalNet(args, False)
        self.workers_seen = []  # what the test reads: each task's loader workers

    def incremental_train(self, data_manager):
        self._cur_task += 1
        self._total_classes = self._known_classes + data_manager.get_task_size(self._cur_task)
        self._network.update_fc(self._total_classes)
        train = data_manager.get_dataset(
            np.arange(self._known_classes, self._total_classes), source="train", mode="train"
        )
        loader = DataLoader(train, batch_size=batch_size, shuffle=True, num_workers=num_workers)
        self.workers_seen.append(loader.num_workers)

    def after_task(self):
        self._known_classes = self._total_classes
