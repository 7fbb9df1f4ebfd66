"""``strategies.optim``: the optimiser a config names, and its learning-rate schedules checked against
learning rates computed by hand. How a training loop steps them is in ``test_strategy_api.py``."""

import math

import pytest
import torch

from strategies.config import StrategyConfig
from strategies.optim import (
    OPTIMIZERS,
    SCHEDULES,
    build_optimizer,
    build_scheduler,
    coda_cosine_factor,
    warmup_cosine_factor,
)

LR = 0.1


def _learning_rates(steps: int, epochs: int, steps_per_epoch: int, **options) -> list[float]:
    """The learning rate before each of ``steps`` scheduler steps, and after the last."""
    config = StrategyConfig(lr=LR, **options)
    optimizer = build_optimizer([torch.nn.Parameter(torch.zeros(2))], config)
    scheduler = build_scheduler(optimizer, config, epochs, steps_per_epoch)
    rates = [optimizer.param_groups[0]["lr"]]
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
        rates.append(optimizer.param_groups[0]["lr"])
    return rates


def test_the_choices_are_the_config_literals():
    assert OPTIMIZERS == ("adamw", "adam", "sgd")
    assert SCHEDULES == ("cosine_iter", "cosine_epoch", "coda_cosine")


@pytest.mark.parametrize(
    ("name", "kind", "momentum"),
    [("adamw", torch.optim.AdamW, None), ("adam", torch.optim.Adam, None), ("sgd", torch.optim.SGD, 0.9)],
)
def test_the_optimizer_takes_lr_weight_decay_and_sgds_momentum_from_the_config(name, kind, momentum):
    config = StrategyConfig(optimizer=name, lr=0.02, weight_decay=0.3, momentum=momentum or 0.0)
    params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2, 2))]
    optimizer = build_optimizer(params, config)
    (group,) = optimizer.param_groups
    assert type(optimizer) is kind and group["params"] == params
    assert group["lr"] == 0.02 and group["weight_decay"] == 0.3
    assert group.get("momentum") == momentum


def test_warmup_cosine_factor_by_hand():
    # 10 steps, 2 of warm-up, ending at 0.1: 1/2, 2/2, then 0.1 + 0.9 * (1 + cos(pi * k / 8)) / 2
    factors = [warmup_cosine_factor(step, 10, 2, 0.1) for step in range(11)]
    assert factors[:3] == pytest.approx([0.5, 1.0, 1.0])
    assert factors[6] == pytest.approx(0.55)  # half-way through the cosine
    assert factors[10] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(factors[1:], factors[2:]))


def test_the_warmup_cosine_stays_at_its_floor_past_the_last_step():
    assert warmup_cosine_factor(12, 10, 2, 0.1) == pytest.approx(0.1)
    assert warmup_cosine_factor(0, 4, 0, 0.0) == 1.0 and warmup_cosine_factor(2, 4, 0, 0.0) == pytest.approx(
        0.5
    )


def test_the_coda_cosine_by_hand():
    assert coda_cosine_factor(0, 20) == 1.0 and coda_cosine_factor(0, 1) == 1.0
    assert math.isclose(coda_cosine_factor(19, 20), math.cos(99 * math.pi / 200))  # about 1.6 % of lr
    assert math.isclose(coda_cosine_factor(10, 21), math.cos(99 * math.pi * 10 / 4000))  # 200 (K - 1) = 4000


def test_cosine_iter_runs_over_every_step_of_the_task():
    # 2 epochs x 3 steps: lr (1 + cos(pi k / 6)) / 2 at step k
    rates = _learning_rates(6, epochs=2, steps_per_epoch=3)
    assert rates == pytest.approx([0.1, 0.0933013, 0.075, 0.05, 0.025, 0.0066987, 0.0], abs=1e-7)


def test_cosine_iter_ends_at_its_floor():
    # min_lr_ratio 0.1: 0.01 + 0.09 (1 + cos(pi k / 4)) / 2
    rates = _learning_rates(4, epochs=1, steps_per_epoch=4, min_lr_ratio=0.1)
    assert rates == pytest.approx([0.1, 0.0868198, 0.055, 0.0231802, 0.01], abs=1e-7)


def test_cosine_epoch_counts_epochs_not_steps():
    # 4 epochs of 100 steps, stepped once an epoch: (1 + cos(pi e / 4)) / 2
    rates = _learning_rates(4, epochs=4, steps_per_epoch=100, schedule="cosine_epoch")
    assert rates == pytest.approx([0.1, 0.0853553, 0.05, 0.0146447, 0.0], abs=1e-7)


def test_a_warmup_climbs_linearly_then_the_cosine_runs_over_the_rest():
    # 6 steps, 2 of warm-up: 1/2, 2/2, then (1 + cos(pi (k - 2) / 4)) / 2
    rates = _learning_rates(6, epochs=2, steps_per_epoch=3, warmup_steps=2)
    assert rates == pytest.approx([0.05, 0.1, 0.1, 0.0853553, 0.05, 0.0146447, 0.0], abs=1e-7)
    # CLAP's form: a fraction 0.3 of 8 steps is int(2.4) = 2 steps of warm-up at (k + 1) / 3, then the
    # cosine over the other 6: (1 + cos(pi (k - 2) / 6)) / 2
    by_fraction = _learning_rates(8, epochs=2, steps_per_epoch=4, warmup_fraction=0.3)
    cosine = [0.1 * (1 + math.cos(math.pi * k / 6)) / 2 for k in range(7)]
    assert by_fraction == pytest.approx([0.1 / 3, 0.2 / 3, *cosine], abs=1e-9)


def test_the_coda_cosine_is_per_epoch_one_epoch_late_and_takes_no_warmup():
    # the official loop's: epochs 0 and 1 at the full rate, epoch 2 at factor(1) (issue 52)
    rates = _learning_rates(2, epochs=3, steps_per_epoch=50, schedule="coda_cosine", warmup_steps=5)
    assert rates == pytest.approx([0.1, 0.1, 0.1 * math.cos(99 * math.pi / 400)])


def test_the_closed_form_agrees_with_torchs_cosine_where_there_is_no_warmup():
    closed = [LR * warmup_cosine_factor(step, 7, 0, 0.2) for step in range(8)]
    assert _learning_rates(7, epochs=7, steps_per_epoch=1, min_lr_ratio=0.2) == pytest.approx(
        closed, abs=1e-12
    )
