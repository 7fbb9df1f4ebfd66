import torch


def get_scheduler(model, args, reload_optim=True):
    """A step schedule that halves the rate each epoch when ``--lr_scheduler step`` is given."""
    if args.lr_scheduler is None:
        return None
    if reload_optim:
        model.opt = model.get_optimizer()
    return torch.optim.lr_scheduler.StepLR(model.opt, step_size=1, gamma=0.5)
