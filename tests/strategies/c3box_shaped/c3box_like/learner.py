"""A C3Box-shaped CLIP learner: tokenizer and both towers, names and templates from the
DataManager, task sizes from args, .cuda() calls, and a prediction that is top-k indices."""

import os

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from c3box_like.inc_net import ClipNet, DirectNet, PtmNet

num_workers = 0
tuned_epoch = 8
RANKED = []  # every logits tensor its _eval_cnn ranked, for the test to compare with the suite's scores


class Learner:
    def __init__(self, args):
        self.args = args
        self._cur_task = -1
        self._known_classes = 0
        self._total_classes = 0
        self._device = args["device"][0]
        self.topk = 2
        self._network = ClipNet(args, True)
        self.direct = DirectNet()
        self.ptm = PtmNet()
        self.epochs_run = []
        self.sizes_seen = []
        self.cwds = []  # where its code ran (C3Box reads ./utils/... and writes into it)

    def after_task(self):
        self._known_classes = self._total_classes

    def incremental_train(self, data_manager):
        self._cur_task += 1
        self.cwds.append(os.getcwd())
        self.sizes_seen.append((self.args["init_cls"], self.args["increment"]))
        size = self.args["init_cls"] if self._cur_task == 0 else self.args["increment"]
        self._total_classes = self._known_classes + size
        self.data_manager = data_manager
        train = data_manager.get_dataset(
            np.arange(self._known_classes, self._total_classes), "train", "train"
        )
        loader = DataLoader(train, batch_size=4, shuffle=True, num_workers=num_workers)
        self._network.to(self._device)
        for name, param in self._network.named_parameters():
            param.requires_grad = name.startswith("proj")
        optimizer = torch.optim.SGD([p for p in self._network.parameters() if p.requires_grad], lr=0.01)
        self._network.train()
        for _ in range(tuned_epoch):
            for _, inputs, targets in loader:
                logits = self.logits(inputs.cuda())
                loss = F.cross_entropy(logits, targets.cuda())
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        self.epochs_run.append(tuned_epoch)

    def text_features(self):
        labels = self.data_manager._class_to_label[: self._total_classes]
        template = self.data_manager._data_to_prompt[0]
        tokens = self._network.tokenizer([template.format(label) for label in labels]).cuda()
        return F.normalize(self._network.encode_text(tokens), dim=-1)

    def logits(self, images):
        image = F.normalize(self._network.encode_image(images), dim=-1)
        return image @ self.text_features().T

    def _eval_cnn(self, loader):
        self._network.eval()
        y_pred, y_true = [], []
        for _, (_, inputs, targets) in enumerate(loader):
            with torch.no_grad():
                outputs = self.logits(inputs.to(self._device))
            RANKED.append(outputs)
            predicts = torch.topk(outputs, k=self.topk, dim=1, largest=True, sorted=True)[1]
            y_pred.append(predicts.cpu().numpy())
            y_true.append(targets.cpu().numpy())
        return np.concatenate(y_pred), np.concatenate(y_true)
