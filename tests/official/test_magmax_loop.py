"""MagMax's training loop against the official ``finetune`` + merge (fixture magmax.loop): the
strategy trained by ``CLIPStrategy``'s own loop on the fixture's batches, compared after every step
(loss, learning rate, every visual tensor) and after every task (the merged model's scores); and
the comparison fails when a learning rate, a weight decay, a loss weight or the scheduler's
step differs."""

import pytest
import torch
import torch.nn.functional as F

from benchmarks.backbone.full_tuning import visual_parameters
from tests.official import loop_helpers as shared
from tests.official.goldens.golden import load_golden
from tests.official.goldens.magmax_loop import TASKS, suite_strategy

# Same module, same batches, same float32 operations in another order (the suite's encode_image
# and head against open_clip's and the official ClassificationHead): rounding of 1e-7 relative,
# carried through 10 Adam steps of lr 1e-3 whose updates are bounded by the lr.
TOLERANCES = {
    "loss": 1e-5,  # CE of logits about 25 (cosines x 100)
    "lr": 1e-9,  # the same closed form; the fixture stores float32
    # a tensor's change summed over up to 49,152 entries, each with the float32 rounding (about 1e-7)
    # of the weight it is the change of, over 10 steps
    "sum": 2e-4,
    "projection": 6e-4,  # 2.1e-4 measured on an Intel Xeon with AMX (MKL's AVX-512 path), 2.5 times
    "norm": 2e-6,
    "entry": 5e-7,  # one entry's change: rounding of a weight of about 1 (ulp 1.2e-7), a few steps
    "scores": 1e-4,  # logits about 25, the merged model's float32 rounding times 100
    # k_proj.bias: its gradient is zero but for rounding (softmax ignores a key shift common to all
    # keys), and Adam scales that rounding to steps of up to the lr on both sides: its change is
    # only bounded, by twice the lrs of both tasks' steps (7e-3)
    "noise": 1.4e-2,
}
NOISE = ("k_proj.bias",)


@pytest.fixture(scope="module")
def fixture():
    return load_golden("magmax.loop")


def _run(fixture, strategy, perturb_loss: bool = False):
    tensors, _ = fixture
    if perturb_loss:
        shared.weigh_the_loss(strategy)
    model = strategy.backbone.model
    initial = {n: p.detach().clone() for n, p in visual_parameters(model).items()}
    return shared.run_suite_loop(strategy, tensors, TASKS, lambda: visual_parameters(model), initial)


suite_run = shared.suite_run_fixture(suite_strategy, _run)


def test_every_step_and_task_equals_the_official_loop(fixture, suite_run):
    tensors, meta = fixture
    strategy, loop = suite_run
    assert [len(r.losses) for r in loop.records] == [meta["sizes"]["steps"]] * meta["sizes"]["tasks"]
    diffs = shared.loop_differences(loop, tensors, NOISE)
    assert not shared.beyond_margin(diffs, TOLERANCES), diffs
    lrs = tensors["output.task0.step0.lr"].new_tensor([0.0])
    for t in range(meta["sizes"]["tasks"]):
        lrs += sum(tensors[f"output.task{t}.step{s}.lr"].double() for s in range(meta["sizes"]["steps"]))
    assert TOLERANCES["noise"] >= 2 * lrs.item() - 1e-9
    # what trains is the visual tower, and all of it: the text tower stays as it was
    assert set(strategy.optimized_parameters) == {
        f"backbone.model.visual.{n}" for n in visual_parameters(strategy.backbone.model)
    }


test_the_comparison_fails_under_a_perturbation = shared.perturbation_test(
    suite_strategy, _run, TOLERANCES, 1.05e-3, "cosine_epoch", 0.105, noise=NOISE
)


@pytest.mark.parametrize("max_norm", [0.99, 1.01])
def test_a_clipping_norm_one_percent_off_is_caught(fixture, max_norm):
    """The recipe clips at 1.0. Adam divides out a gradient's scale, so a clipping norm 1 % off moves
    only the tensors' norms, by about 1.6 times their tolerance (the unperturbed loop's: 0.14): a
    thin margin by nature, measured rather than assumed."""
    tensors, _ = fixture
    diffs = shared.loop_differences(_run(fixture, suite_strategy(grad_clip=max_norm)), tensors, NOISE)
    assert "norm" in shared.exceeded(diffs, TOLERANCES), diffs


def test_the_fixture_starts_from_the_suites_tiny_clip(fixture):
    """The first step's change is small and the fixture's first loss is the suite's own first CE on
    the untouched model: both sides started from the same weights."""
    tensors, _ = fixture
    strategy = suite_strategy()
    strategy.current_classes = list(TASKS[0])
    with torch.no_grad():
        head = strategy.text_features(list(TASKS[0]))
        image = strategy.backbone.encode_image(tensors["input.task0.x0"], normalize=True)
        loss = F.cross_entropy(strategy.backbone.logit_scale * image @ head.T, tensors["input.task0.y0"])
    assert abs(loss.item() - tensors["output.task0.step0.loss"].item()) <= TOLERANCES["loss"]
