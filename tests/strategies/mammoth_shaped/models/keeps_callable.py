from models.sgd_like import SgdLike


class KeepsCallable(SgdLike):
    """Keeps, after a task, state that is neither tensors nor plain values."""

    NAME = "keeps-callable"

    def end_task(self, dataset):
        past = self.n_seen_classes
        self.mask = lambda logits: logits[:, :past]
