"""L2P++, DualPrompt and CODA-Prompt's training loops against the official CODA-Prompt code
(GT-RIPL/CODA-Prompt, ``NormalNN.learn_batch`` with the ``Prompt`` learners; fixtures
``{l2p_pp,dualprompt,coda_prompt}.loop`` of ``tests/official/goldens/prompt_loops.py``).

The suite's strategy trains through its own ``learn`` (Avalanche's loop, the suite's Adam, CODA cosine
and loss) on the fixture's batches in the fixture's order, 2 tasks x 3 epochs x 2 steps; after every
step the loss, every group's learning rate and every trainable tensor must equal the official ones,
after every task the logits of the fixed test images. Each comparison must fail when the suite's
learning rate, weight decay, loss weight or scheduler step is changed.

Tolerances: both sides run the same operations in another order (the official per-layer prompt
modules and einsums against the suite's stacked tensors), in float64 (the fixtures' generator and
``suite_loop`` below), carried through 12 Adam steps of lr 1e-3. Adam's update is the ratio of two
moments, so an entry whose gradient is rounding noise moves by far more than its rounding (CODA's
tensors, 2.6e-8). In float32 that noise was up to 4.2e-6 and differed between CPUs; in float64 the
kernel paths of an Intel Xeon (its default, ATEN_CPU_CAPABILITY=avx2 with MKL_CBWR=AVX2) give the
same differences to 1e-12 or closer.
"""

import pytest
import torch

from tests.official.goldens.golden import load_golden
from tests.official.goldens.loop import default_float64, in_float64
from tests.official.goldens.prompt_loops import (
    CONFIGS,
    EPOCHS,
    SEEDS,
    STEPS,
    TASKS,
    batches_of,
    strategy_class,
    suite_tensors,
)
from tests.official.goldens.suite_loop import StepRecord, run_suite_loop
from tests.official.loop_helpers import beyond_margin, exceeded, extra_scheduler_step, record_differences

METHODS = ["l2p_pp", "dualprompt", "coda_prompt"]
TOLERANCES = {
    # measured (both kernel paths): loss 4.5e-12, tensors 2.6e-8, scores 4.1e-11 (CODA); L2P++ and
    # DualPrompt 1.4e-14 or less. Each tolerance is over 7 times the largest.
    "loss": 1e-10,  # losses up to ~92 (L2P's all-pairs key loss)
    "lr": 1e-12,  # the same closed form on both sides
    "tensors": 2e-7,  # entries of size <= 1 after 12 Adam steps of lr 1e-3
    "scores": 1e-9,  # head logits of size ~10 through the prompted tiny CLIP
}
STEPS_PER_TASK = EPOCHS * STEPS


def replayed_draws(strategy, draws: dict[str, torch.Tensor]) -> None:
    """CODA's ``setup_task`` at task 1 draws the official ``process_task_count``'s rows (per layer
    K, A, P, row after row): ``torch.randn`` returns them, in that order, while it runs."""
    setup_task = strategy.setup_task

    def with_official_draws(task, classes):
        if task == 0:
            return setup_task(task, classes)
        queue = [
            row
            for layer in range(len(CONFIGS["coda_prompt"]["prompt_layers"]))
            for name in ("keys", "attention", "prompts")
            for row in draws[name][layer]
        ]
        randn = torch.randn

        def official(*size, generator=None, dtype=None, device=None, **kwargs):
            row = queue.pop(0)
            assert tuple(size) == tuple(row.shape), (size, row.shape)
            return row.to(dtype=dtype or row.dtype, device=device)

        torch.randn = official
        try:
            setup_task(task, classes)
        finally:
            torch.randn = randn
        assert not queue, f"{len(queue)} official draws left unused"

    strategy.setup_task = with_official_draws


def suite_loop(method: str, tensors: dict, perturb=None, **changes) -> dict[str, float]:
    """Train the suite's ``method`` on the fixture's batches; the largest |suite - official| of each
    compared quantity. ``changes``: config options; ``perturb(strategy)``: anything else. In
    float64, as the fixture's official side ran."""
    with default_float64():
        return _suite_loop(method, in_float64(tensors), perturb, **changes)


def _suite_loop(method: str, tensors: dict, perturb=None, **changes) -> dict[str, float]:
    from tests.official.goldens.coda_prompt_repo import suite_strategy

    cls = strategy_class(method)
    holder: dict = {}
    record = StepRecord(lambda: suite_tensors(method, holder["strategy"]))
    strategy = suite_strategy(cls, 4, SEEDS[method], **{**CONFIGS[method], **changes})
    strategy.backbone.to(torch.float64)  # open_clip builds it in float32 whatever the default
    strategy.plugins.append(record)
    holder["strategy"] = strategy
    start = {n: t.detach() for n, t in suite_tensors(method, strategy).items()}
    if method == "coda_prompt":
        replayed_draws(
            strategy, {n: tensors[f"state.task1.draws.{n}"] for n in ("keys", "attention", "prompts")}
        )
    else:  # CODA's task-0 slice is drawn in learn (the first step's tensors show it)
        for name, tensor in start.items():
            assert torch.equal(tensor, tensors[f"param.{name}"]), name
    if perturb is not None:
        perturb(strategy)
    scores = run_suite_loop(
        strategy,
        record,
        TASKS,
        [batches_of(tensors, t) for t in range(len(TASKS))],
        tensors["input.test.images"],
    )
    assert len(record.steps) == len(TASKS) * STEPS_PER_TASK
    diffs = {key: 0.0 for key in TOLERANCES}
    record_differences(record.steps, scores, tensors, diffs)
    return diffs


@pytest.fixture(scope="module", params=METHODS)
def method(request):
    return request.param, load_golden(f"{request.param}.loop")


def test_every_step_and_task_equals_the_official_loop(method):
    name, (tensors, meta) = method
    assert meta["sizes"] == {"tasks": 2, "epochs": EPOCHS, "steps_per_epoch": STEPS, "batch": 4, "test": 6}
    diffs = suite_loop(name, tensors)
    assert not beyond_margin(diffs, TOLERANCES), diffs
    print(f"{name}.loop max |suite - official|: {diffs}")


def _heavier_cross_entropy(strategy) -> None:
    """CODA's one loss term (its orthogonality weight is 0 officially): CE weighted 1.5."""
    compute_loss = strategy.compute_loss
    strategy.compute_loss = lambda output, targets: 1.5 * compute_loss(output, targets)


PERTURBATIONS = {
    "learning rate": ({"lr": 1.1e-3}, None, "lr"),
    "weight-decay group": ({"weight_decay": 1e-2}, None, "tensors"),
    "scheduler step": ({}, extra_scheduler_step, "lr"),  # CODA's schedule: one epoch ahead
}


@pytest.mark.parametrize("perturbation", [*PERTURBATIONS, "loss weight"])
def test_the_comparison_fails_under_a_perturbation(method, perturbation):
    name, (tensors, _) = method
    if perturbation == "loss weight":
        changes, perturb = (
            ({}, _heavier_cross_entropy) if name == "coda_prompt" else ({"key_loss_weight": 0.5}, None)
        )
        caught = "loss"
    else:
        changes, perturb, caught = PERTURBATIONS[perturbation]
    diffs = suite_loop(name, tensors, perturb, **changes)
    assert caught in exceeded(diffs, TOLERANCES), (perturbation, diffs)
