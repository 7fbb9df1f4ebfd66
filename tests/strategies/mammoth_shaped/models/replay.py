from utils.args import add_rehearsal_args
from utils.buffer import Buffer

from models.utils.continual_model import ContinualModel


class Replay(ContinualModel):
    """Experience replay: each batch joined by ``minibatch_size`` stored images."""

    NAME = "replay"
    COMPATIBILITY = ["class-il"]

    @staticmethod
    def get_parser(parser):
        add_rehearsal_args(parser)
        return parser

    def __init__(self, backbone, loss, args, transform, dataset=None):
        super().__init__(backbone, loss, args, transform, dataset=dataset)
        self.buffer = Buffer(self.args.buffer_size)

    def observe(self, inputs, labels, not_aug_inputs, epoch=None):
        import torch

        real = len(labels)
        self.opt.zero_grad()
        if not self.buffer.is_empty():
            old_inputs, old_labels = self.buffer.get_data(self.args.minibatch_size, device=self.device)[:2]
            inputs, labels = torch.cat([inputs, old_inputs]), torch.cat([labels, old_labels])
        loss = self.loss(self.net(inputs), labels)
        loss.backward()
        self.opt.step()
        self.buffer.add_data(not_aug_inputs, labels[:real])
        return loss.item()
