"""A base learner in PyCIL's shape: counters, exemplar memory kept as item arrays handed out by
``get_dataset(ret_data=True)`` and given back through ``appendent``, class means as numpy."""

import logging

import numpy as np
import torch
from torch.utils.data import DataLoader

batch_size = 16


class BaseLearner:
    def __init__(self, args):
        self.args = args
        self._cur_task = -1
        self._known_classes = 0
        self._total_classes = 0
        self._network = None
        self._old_network = None
        self._data_memory, self._targets_memory = np.array([]), np.array([])
        self._memory_size = args["memory_size"]
        self._device = args["device"][0]
        self._multiple_gpus = args["device"]

    @property
    def samples_per_class(self):
        return self._memory_size // self._total_classes

    def _get_memory(self):
        return None if len(self._data_memory) == 0 else (self._data_memory, self._targets_memory)

    def _extract_vectors(self, loader):
        self._network.eval()
        vectors, targets = [], []
        with torch.no_grad():
            for _, inputs, labels in loader:
                vectors.append(self._network.extract_vector(inputs.to(self._device)).cpu().numpy())
                targets.append(labels.numpy())
        return np.concatenate(vectors), np.concatenate(targets)

    def _compute_accuracy(self, loader):
        self._network.eval()
        correct = total = 0
        with torch.no_grad():
            for _, inputs, labels in loader:
                predicted = self._network(inputs.to(self._device))["logits"].argmax(1).cpu()
                correct += int((predicted == labels).sum())
                total += len(labels)
        return 100 * correct / total

    def build_rehearsal_memory(self, data_manager, m):
        """Keep the first ``m`` exemplars of each old class, then pick ``m`` of each new class nearest
        to its mean; every class mean is computed on its exemplars."""
        kept_data, kept_targets = [], []
        for c in range(self._known_classes):
            mask = np.where(self._targets_memory == c)[0][:m]
            kept_data.append(self._data_memory[mask])
            kept_targets.append(self._targets_memory[mask])
        for c in range(self._known_classes, self._total_classes):
            data, targets, dataset = data_manager.get_dataset(
                np.arange(c, c + 1), source="train", mode="test", ret_data=True
            )
            vectors, _ = self._extract_vectors(DataLoader(dataset, batch_size=batch_size))
            nearest = np.argsort(((vectors - vectors.mean(0)) ** 2).sum(1))[:m]
            kept_data.append(np.array([data[i] for i in nearest]))
            kept_targets.append(np.full(len(nearest), c))
        self._data_memory, self._targets_memory = np.concatenate(kept_data), np.concatenate(kept_targets)
        self._class_means = np.zeros((self._total_classes, self._network.feature_dim))
        for c in range(self._total_classes):
            mask = self._targets_memory == c
            dataset = data_manager.get_dataset(
                [],
                source="train",
                mode="test",
                appendent=(self._data_memory[mask], self._targets_memory[mask]),
            )
            vectors, _ = self._extract_vectors(DataLoader(dataset, batch_size=batch_size))
            self._class_means[c] = vectors.mean(0)
        logging.info("Exemplar size: %d", len(self._targets_memory))
