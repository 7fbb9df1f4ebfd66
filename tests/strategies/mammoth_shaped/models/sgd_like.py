from models.utils.continual_model import ContinualModel


class SgdLike(ContinualModel):
    NAME = "sgd-like"
    COMPATIBILITY = ["class-il"]

    def observe(self, inputs, labels, not_aug_inputs, epoch=None):
        self.opt.zero_grad()
        loss = self.loss(self.net(inputs), labels)
        loss.backward()
        self.opt.step()
        return loss.item()
