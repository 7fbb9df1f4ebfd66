"""L2P++, DualPrompt and CODA-Prompt's training loops against the official CODA-Prompt code
(GT-RIPL/CODA-Prompt, ``NormalNN.learn_batch`` with the ``Prompt`` learners; fixtures
``{l2p_pp,dualprompt,coda_prompt}.loop`` of ``tests/official/goldens/prompt_loops.py``).

The suite's strategy trains through its own ``learn`` (Avalanche's loop, the suite's Adam, CODA cosine
and loss) on the fixture's batches in the fixture's order, 2 tasks x 3 epochs x 2 steps; after every
step the loss, every group's learning rate and every trainable tensor must equal the official ones,
after every task the logits of the fixed test images. Each comparison must fail when the suite's
learning rate, weight decay, loss weight or scheduler step is changed.

Tolerances: both sides run the same float32 operations in another order (the official per-layer
prompt modules and einsums against the suite's stacked tensors), rounding of about 1e-7 relative,
carried through 12 Adam steps of lr 1e-3. Adam's update is the ratio of two moments, so an entry
whose gradient is rounding noise can move by up to the lr in a step; measured maxima are in the
test's failure message and in docs/baselines.md §16.
"""

import pytest
import torch

from tests.official.goldens.golden import load_golden
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
    "loss": 5e-5,  # float32 losses up to ~92 (L2P's all-pairs key loss): a few units of its 7.6e-6 spacing
    # the same closed form on both sides; the fixture stores it in float32, whose rounding of an lr
    # of at most 1e-3 is at most half its unit, 5.8e-11 (1e-3 is 4.7e-11 off): the same on any machine
    "lr": 1e-10,
    # entries of size <= 1 after 12 Adam steps of lr 1e-3; where a gradient is near Adam's eps (1e-8),
    # lr g / (|g| + eps) turns its float32 rounding (~1e-11) into ~1e-6 in one step (CODA: 1.2e-6;
    # DualPrompt 4.2e-6 on an Intel Xeon with AMX and ATEN_CPU_CAPABILITY=avx2: 2.5 times that)
    "tensors": 1.2e-5,
    "scores": 1e-5,  # head logits of size ~10 through the prompted tiny CLIP
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
    compared quantity. ``changes``: config options; ``perturb(strategy)``: anything else."""
    from tests.official.goldens.coda_prompt_repo import suite_strategy

    cls = strategy_class(method)
    holder: dict = {}
    record = StepRecord(lambda: suite_tensors(method, holder["strategy"]))
    strategy = suite_strategy(cls, 4, SEEDS[method], **{**CONFIGS[method], **changes})
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
