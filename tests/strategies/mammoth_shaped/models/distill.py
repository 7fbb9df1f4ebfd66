import torch
import torch.nn.functional as F

from models.utils.continual_model import ContinualModel


class Distill(ContinualModel):
    """LwF's habits: the task counters decide what is trained and distilled, and the old model's
    logits ride on the task's dataset as an extra field of every item."""

    NAME = "distill"
    COMPATIBILITY = ["class-il"]

    @staticmethod
    def get_parser(parser):
        parser.add_argument("--alpha", type=float, default=0.5)
        return parser

    def begin_task(self, dataset):
        items = dataset.train_loader.dataset
        if self.current_task > 0:
            with torch.no_grad():
                self.net.eval()
                images = torch.stack([items[i][2] for i in range(items.data.shape[0])])
                items.logits = self.net(images.to(self.device)).cpu()
                self.net.train()
            items.extra_return_fields += ("logits",)

    def observe(self, inputs, labels, not_aug_inputs, logits=None, epoch=None):
        self.opt.zero_grad()
        outputs = self.net(inputs)
        loss = self.loss(outputs[:, : self.n_seen_classes], labels)
        if logits is not None:
            past = self.n_past_classes
            old = F.softmax(logits[:, :past], dim=1)
            loss = loss + self.args.alpha * F.kl_div(
                F.log_softmax(outputs[:, :past], dim=1), old, reduction="batchmean"
            )
        loss.backward()
        self.opt.step()
        return loss.item()
