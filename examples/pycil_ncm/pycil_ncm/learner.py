"""A nearest-class-mean learner in PyCIL's shape: each class is the normalised mean of its training
images' frozen CLIP features, and an image's logits are its cosine similarity to every class mean.

Run it with the suite as ``--strategies pycil:pycil_ncm.learner:NCM``."""

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader


class NCMNet(nn.Module):
    """Frozen CLIP image features, then cosine similarity to one mean per class position."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.register_buffer("class_means", torch.zeros(0, backbone.embed_dim))

    def update_fc(self, n_classes: int) -> None:
        """Room for ``n_classes`` means; the learned ones are kept."""
        grown = self.class_means.new_zeros(n_classes, self.class_means.shape[1])
        grown[: len(self.class_means)] = self.class_means
        self.class_means = grown

    def features(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone.encode_image(images, normalize=True)

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.features(images) @ self.class_means.T}


class NCM:
    """The learner: ``incremental_train`` adds the new classes' means; nothing is trained."""

    def __init__(self, args: dict) -> None:
        self.args = args
        self._device = args["device"][0]
        self._network = NCMNet(args["backbone"]).to(self._device)
        self._cur_task, self._known_classes, self._total_classes = -1, 0, 0

    @torch.no_grad()
    def incremental_train(self, data_manager) -> None:
        self._cur_task += 1
        self._total_classes = self._known_classes + data_manager.get_task_size(self._cur_task)
        self._network.update_fc(self._total_classes)
        new = np.arange(self._known_classes, self._total_classes)
        dataset = data_manager.get_dataset(new, source="train", mode="test")
        sums = torch.zeros(len(new), self._network.class_means.shape[1], device=self._device)
        counts = torch.zeros(len(new), device=self._device)
        self._network.eval()
        for _, images, labels in DataLoader(dataset, batch_size=self.args.get("batch_size", 64)):
            rows = labels.to(self._device) - self._known_classes
            sums.index_add_(0, rows, self._network.features(images.to(self._device)))
            counts += torch.bincount(rows, minlength=len(new))
        means = F.normalize(sums / counts.clamp(min=1).unsqueeze(1), dim=-1)
        self._network.class_means[self._known_classes :] = means

    def after_task(self) -> None:
        self._known_classes = self._total_classes
