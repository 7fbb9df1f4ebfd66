"""MG-CLIP's training loop against the official ``run_class_incremental`` (fixture mg_clip.loop):
the strategy trained by ``CLIPStrategy``'s own loop on the fixture's batches, compared after every
step of both stages (the LoRA stage: loss, learning rate, every LoRA tensor of both towers; the
visual stage: loss, learning rate, the new rows of the classifier) and after every task (the fused
scores); and the comparison fails when a learning rate, a weight decay, a loss weight or the
scheduler's step differs."""

import math

import pytest
import torch
import torch.nn.functional as F

import strategies.methods.mg_clip
from tests.official import loop_helpers as shared
from tests.official.goldens.golden import load_golden
from tests.official.goldens.loop import StepRecord, default_float64, in_float64, on_every_optimizer_step
from tests.official.goldens.mg_clip_loop import TASKS, lora, suite_strategy, visual_batches

# The same modules, operations in another order (the official forward_clip around the suite's
# towers, class means summed in another order), over 10 Adam steps a task (lr 1e-3) and 6 of the
# visual stage (lr 5e-4), both sides in float64 (tests/official/goldens/mg_clip_loop.py). In
# float32 an entry whose gradient is below Adam's eps (1e-8) turned its rounding into steps of up to
# 3e-5, and two CPUs (an AMD EPYC, an Intel Xeon) came apart by more than the tolerances set on one.
# In float64 the kernel paths (the Xeon's default, ATEN_CPU_CAPABILITY=avx2 with MKL_CBWR=AVX2) give
# the same differences to the last digit: sums 2.3e-7, projections 3.3e-7, norms 1.4e-8, entries
# 1.4e-9, loss 7e-8, scores 1.5e-8. Each tolerance is over 6 times that.
TOLERANCES = {
    "loss": 1e-6,  # CE of logits about 20 and of raw cosines
    "lr": 1e-9,  # CosineAnnealingLR against the closed form
    "sum": 2e-6,  # a LoRA tensor's change summed over up to 1,024 entries; the classifier's rows
    "projection": 2e-6,
    "norm": 1e-7,
    "entry": 1e-8,  # one entry's change; the classifier's rows are compared as they are (about 1)
    "scores": 1e-7,  # probabilities
}


class _RecordedF:
    """torch.nn.functional with cross_entropy's value kept (the visual stage's loss)."""

    def __init__(self, losses) -> None:
        self.losses = losses

    def cross_entropy(self, *args, **kwargs):
        loss = F.cross_entropy(*args, **kwargs)
        self.losses.append(float(loss.detach()))
        return loss

    def __getattr__(self, name):
        return getattr(F, name)


@pytest.fixture(scope="module")
def fixture():
    return load_golden("mg_clip.loop")


def _run(fixture, strategy, perturb_loss: bool = False):
    """The suite's side in float64, as the fixture's official side ran."""
    with default_float64():
        return _float64_run(in_float64(fixture[0]), strategy, perturb_loss)


def _float64_run(tensors, strategy, perturb_loss: bool = False):
    initial = {n[len("param.") :]: t for n, t in tensors.items() if n.startswith("param.")}
    task = {"t": 0}
    visual = [
        {"visual": StepRecord(lambda: {"classifier.rows": rows[0]}, {"classifier.rows": torch.zeros(())})}
        for _ in TASKS
    ]
    rows: list[torch.Tensor] = [torch.zeros(())]
    losses: list[float] = []

    def setup(t):
        task["t"] = t
        if t == 0:  # the fixture's initial LoRA (the official model ran the same)
            with torch.no_grad():
                for name, p in lora(strategy.backbone).items():
                    p.copy_(initial[name])
            if perturb_loss:
                shared.weigh_the_loss(strategy)

    own_loader = strategy.data_loader

    def data_loader(dataset, *args, purpose="eval", **kwargs):
        if purpose == "visual-classifier":  # the official visual stage's batches, in order
            return [[x, y, torch.zeros_like(y)] for x, y in visual_batches(tensors, task["t"])]
        return own_loader(dataset, *args, purpose=purpose, **kwargs)

    strategy.data_loader = data_loader

    def step_hook(optimizer):
        if optimizer is not strategy.optimizer:  # the visual stage's Adam over the new rows
            rows[0] = optimizer.param_groups[0]["params"][0]
            visual[task["t"]]["visual"].step(losses[-1], [g["lr"] for g in optimizer.param_groups])

    with on_every_optimizer_step(step_hook), pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            strategies.methods.mg_clip, "F", _RecordedF(losses)
        )  # the visual stage's loss, recorded
        loop = shared.run_suite_loop(
            strategy, tensors, TASKS, lambda: lora(strategy.backbone), initial, setup
        )
    loop.stages = visual
    return loop


suite_run = shared.suite_run_fixture(suite_strategy, _run)


def test_every_step_and_task_equals_the_official_loop(fixture, suite_run):
    tensors, meta = fixture
    strategy, loop = suite_run
    assert [len(r.losses) for r in loop.records] == [meta["sizes"]["steps"]] * meta["sizes"]["tasks"]
    assert [len(s["visual"].losses) for s in loop.stages] == [meta["sizes"]["visual_steps"]] * meta["sizes"][
        "tasks"
    ]
    diffs = shared.loop_differences(loop, tensors, stage="lora.")
    assert not shared.beyond_margin(diffs, TOLERANCES), diffs
    assert set(strategy.optimized_parameters) == set(lora(strategy.backbone))  # LoRA of both towers


test_the_comparison_fails_under_a_perturbation = shared.perturbation_test(
    suite_strategy, _run, TOLERANCES, 1.05e-3, "cosine_iter", 1e-4, stage="lora."
)


def _lora_pairs(named: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, A, B) of each LoRA pair, A being ``lora_A`` of the same layer and adapter as B."""
    return [(n, named[n], named[n.replace("lora_A", "lora_B")]) for n in sorted(named) if "lora_A" in n]


@pytest.mark.parametrize("source", ["the suite's own draw", "the fixture's initial LoRA"])
def test_every_lora_starts_by_the_official_rule_not_by_a_copy(fixture, source):
    """MindtheGap's layers.py ``_reset_parameters``: A ``xavier_uniform_``, B 0 (docs/baselines.md §5).
    The loop test starts from the fixture's LoRA, so the rule is checked here on the suite's own
    draw (the fixture holds a draw too). Uniform(-b, b) with b = sqrt(6 / (fan_in + fan_out)): every
    entry within b, the largest near it, the std b / sqrt(3) over each shape's entries pooled;
    peft's default (kaiming, a = sqrt 5: b = 1 / sqrt(fan_in)) fails all three at these shapes."""
    if source == "the suite's own draw":
        strategy = suite_strategy()
        strategy.setup_task(0, list(TASKS[0]))
        named = {n: p.detach() for n, p in lora(strategy.backbone).items()}
    else:
        named = {n[len("param.") :]: t for n, t in fixture[0].items() if n.startswith("param.")}
    pairs = _lora_pairs(named)
    assert len(pairs) == len(named) // 2 > 0
    by_shape: dict[tuple[int, int], list[torch.Tensor]] = {}
    for name, a, b in pairs:
        assert not b.any(), f"{name}: B is not 0"
        by_shape.setdefault(tuple(a.shape), []).append(a.flatten())
    for (fan_out, fan_in), draws in by_shape.items():
        bound = math.sqrt(6 / (fan_in + fan_out))
        pooled = torch.cat(draws).double()
        assert pooled.abs().max() <= bound and pooled.abs().max() > 0.95 * bound, (fan_out, fan_in)
        assert pooled.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05), (fan_out, fan_in)
