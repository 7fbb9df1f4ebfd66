from models.sgd_like import SgdLike


class Broken(SgdLike):
    NAME = "broken"

    def observe(self, inputs, labels, not_aug_inputs, epoch=None):
        return self.net(inputs, returnt="features")["logits"].sum()
