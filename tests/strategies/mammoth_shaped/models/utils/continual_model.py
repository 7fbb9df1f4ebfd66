"""A base model with the habits of Mammoth's ContinualModel (written for the tests): it reads the
dataset object and args in __init__, and its meta_* wrappers keep the task counters and build a
fresh optimiser for every task."""

import inspect
import logging

import torch
from datasets import get_dataset  # the package downloads at import, as Mammoth's
from torch import nn


class ContinualModel(nn.Module):
    NAME = ""
    COMPATIBILITY: list = []

    def __init__(self, backbone, loss, args, transform, dataset=None) -> None:
        super().__init__()
        self.net, self.loss, self.args, self.transform = backbone, loss, args, transform
        self.dataset = dataset if dataset is not None else get_dataset(args)
        self.N_CLASSES = self.dataset.N_CLASSES
        self.N_TASKS = self.dataset.N_TASKS
        self._cpt = self.dataset.N_CLASSES_PER_TASK
        self._current_task = 0
        self.normalization_transform = self.dataset.get_normalization_transform()
        self.opt = self.get_optimizer()
        self.device = torch.device("cpu")
        if args.label_perc != 1:
            logging.info("label_perc is not supported")

    @property
    def current_task(self) -> int:
        return self._current_task

    @property
    def n_past_classes(self) -> int:
        return self._n_past_classes

    @property
    def n_seen_classes(self) -> int:
        return self._n_seen_classes

    def get_optimizer(self):
        params = [p for p in self.net.parameters() if p.requires_grad]
        if self.args.optimizer == "sgd":
            return torch.optim.SGD(
                params, lr=self.args.lr, weight_decay=self.args.optim_wd, momentum=self.args.optim_mom
            )
        kind = torch.optim.AdamW if self.args.optimizer == "adamw" else torch.optim.Adam
        return kind(params, lr=self.args.lr, weight_decay=self.args.optim_wd)

    def to(self, device):
        self.device = device
        return super().to(device)

    def forward(self, x):
        return self.net(x)

    def begin_task(self, dataset) -> None:
        pass

    def end_task(self, dataset) -> None:
        pass

    def meta_begin_task(self, dataset) -> None:
        self._task_iteration = 0
        self._n_past_classes, self._n_seen_classes = dataset.get_offsets(self._current_task)
        self.opt = self.get_optimizer()
        logging.warning("task %d begins", self._current_task)
        self.begin_task(dataset)

    def meta_observe(self, *args, **kwargs):
        takes = inspect.signature(self.observe).parameters
        kwargs = {k: v for k, v in kwargs.items() if k in takes}
        loss = self.observe(*args, **kwargs)
        self._task_iteration += 1
        return loss

    def meta_end_task(self, dataset) -> None:
        self.end_task(dataset)
        self._current_task += 1

    def observe(self, inputs, labels, not_aug_inputs, epoch=None):
        raise NotImplementedError
