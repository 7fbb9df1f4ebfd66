"""MagMax against its official code (danielm1405/magmax, fixtures magmax.merge and magmax.head):
the max-magnitude merge over three tasks with ties, stage by stage, through the strategy's own
``finish_task``; the template-ensemble zero-shot head and its logits; the templates; the warm-up +
cosine schedule; the recipe's defaults."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from benchmarks.backbone.full_tuning import difference, load_visual_state, max_magnitude, visual_state
from benchmarks.data.prompts import CIFAR_TEMPLATES, imagenet_templates
from strategies.base import CLIPStrategy
from strategies.methods.magmax import MagMax, MagMaxConfig, merged
from strategies.optim import build_scheduler
from tests.official.goldens.golden import load_golden
from tests.official.goldens.magmax_repo import micro_clip

# Weights and deltas lie on a 2**-16 grid (the generator's GRID): every difference, selection and
# lambda-scaled sum is exact in float32, so the merge must agree to the bit.
MERGE_ATOL = 0.0
# Unit-norm features and weights: float32 rounding of a 256-long dot product and two renormalisations.
FEATURE_ATOL = 1e-6
# Logits are cosines times the logit scale (about 100): float32 rounding times 100.
LOGIT_ATOL = 1e-4
# The fixture stores the official learning rates (float64 from numpy) as float32.
LR_RTOL = 1e-6


@pytest.fixture(scope="module")
def merge_fixture():
    return load_golden("magmax.merge")


@pytest.fixture(scope="module")
def head_fixture():
    return load_golden("magmax.head")


def _state(tensors, prefix):
    return {name[len(prefix) :]: t for name, t in tensors.items() if name.startswith(prefix)}


def _assert_states_close(ours, official, atol):
    assert ours.keys() == official.keys()
    worst = max((ours[n] - official[n]).abs().max().item() for n in ours)
    assert worst <= atol, f"max |difference| {worst} > {atol}"


def test_merge_stage_by_stage_equals_merge_max_abs_of_the_tasks_so_far(merge_fixture):
    tensors, meta = merge_fixture
    theta_0 = _state(tensors, "param.theta_0.")
    tau_run = None
    for stage in range(1, meta["sizes"]["tasks"] + 1):
        tau_run = max_magnitude(tau_run, difference(_state(tensors, f"input.theta_{stage}."), theta_0))
        _assert_states_close(tau_run, _state(tensors, f"state.tau_run_{stage}."), MERGE_ATOL)
        _assert_states_close(
            merged(theta_0, tau_run, MagMaxConfig().merge_lambda),
            _state(tensors, f"output.merged_{stage}."),
            MERGE_ATOL,
        )


def test_finish_task_leaves_the_official_merged_model_and_keeps_theta_t(merge_fixture):
    """The strategy's own ``finish_task`` after each task: the model it leaves for evaluation is the
    official ``apply_to(merge_max_abs(tvs[:t]), 0.5)``, and theta_t (where task t+1 starts) is the
    fine-tuned weights, not the merge."""
    tensors, meta = merge_fixture
    model = micro_clip()
    strategy = SimpleNamespace(
        backbone=SimpleNamespace(model=model),
        cfg=MagMaxConfig(),
        theta_0=_state(tensors, "param.theta_0."),
        theta=None,
        tau_run=None,
    )
    for stage in range(1, meta["sizes"]["tasks"] + 1):
        theta_t = _state(tensors, f"input.theta_{stage}.")
        load_visual_state(model, theta_t)  # where training of task t ended
        MagMax.finish_task(strategy, stage - 1, [])
        _assert_states_close(visual_state(model), _state(tensors, f"output.merged_{stage}."), MERGE_ATOL)
        _assert_states_close(strategy.theta, theta_t, 0.0)


def _strings(rows: torch.Tensor) -> tuple[str, ...]:
    return tuple(bytes(b for b in row.tolist() if b).decode() for row in rows)


def test_templates_are_the_official_lists(head_fixture):
    tensors, _ = head_fixture
    assert CIFAR_TEMPLATES == _strings(tensors["output.templates_cifar100"])
    # ImageNet-R and ImageNet take imagenet_template officially; the suite's "imagenet" ensemble
    assert imagenet_templates() == _strings(tensors["output.templates_imagenet"])
    assert imagenet_templates() == _strings(tensors["output.templates_imagenetr"])


def test_prompts_tokenise_to_the_official_tokens(head_fixture):
    import open_clip

    from benchmarks.backbone import TINY_MODEL

    tensors, _ = head_fixture
    name = f"class{int(tensors['input.classes'][0])}"
    tokens = open_clip.get_tokenizer(TINY_MODEL)([t.format(name) for t in CIFAR_TEMPLATES])
    assert torch.equal(tokens, tensors["output.prompts_first_class"])


def _head_strategy(tensors):
    """A MagMax whose text tower returns the fixture's per-template features (normalised, as the
    backbone's ``encode_text`` does) and whose image tower returns the fixture's image features."""
    features = tensors["input.text_features"]
    strategy = SimpleNamespace(
        templates=CIFAR_TEMPLATES,
        _fixed_text=None,
        seen_classes=list(range(len(features))),
        backbone=SimpleNamespace(
            active_text_context=None,
            active_adapters={"text": None},
            logit_scale=float(tensors["param.logit_scale"].exp()),
            encode_image=lambda x, normalize=True: F.normalize(x, dim=-1) if normalize else x,
        ),
        template_features=lambda ids: F.normalize(features[ids], dim=-1),
    )
    strategy.text_features = lambda ids: CLIPStrategy.text_features(strategy, ids)
    return strategy


def test_zero_shot_head_and_logits_equal_the_official_head(head_fixture):
    tensors, _ = head_fixture
    strategy = _head_strategy(tensors)
    scale = strategy.backbone.logit_scale
    ensemble = strategy.text_features(strategy.seen_classes)
    assert (scale * ensemble - tensors["output.head_weight"]).abs().max() <= scale * FEATURE_ATOL
    assert not tensors["output.head_bias"].any()  # the official head's bias is zero: the suite has none
    strategy._head = ensemble
    images = tensors["input.image_features"]
    assert (MagMax.compute_logits(strategy, images) - tensors["output.logits"]).abs().max() <= LOGIT_ATOL
    assert (MagMax.scores(strategy, images) - tensors["output.logits"]).abs().max() <= LOGIT_ATOL


@pytest.mark.parametrize("steps", [400, 1200])
def test_schedule_equals_cosine_lr_with_warmup(head_fixture, steps):
    tensors, _ = head_fixture
    cfg = MagMaxConfig()
    official = tensors[f"output.lr_steps{steps}_warmup{cfg.warmup_steps}"].double()
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=cfg.lr)
    scheduler = build_scheduler(optimizer, cfg, cfg.epochs, steps // cfg.epochs)
    ours = []
    for _ in range(steps):  # the lr each optimiser step uses; the strategy steps the scheduler after it
        ours.append(optimizer.param_groups[0]["lr"])
        optimizer.step()  # no gradient: nothing moves
        scheduler.step()
    torch.testing.assert_close(torch.tensor(ours, dtype=torch.float64), official, rtol=LR_RTOL, atol=0.0)


def test_recipe_defaults_equal_the_official_arguments(head_fixture):
    tensors, _ = head_fixture
    cfg = MagMaxConfig()
    args = {k[len("output.args.") :]: float(v) for k, v in tensors.items() if k.startswith("output.args.")}
    assert args["lr"] == pytest.approx(cfg.lr)
    assert args["wd"] == pytest.approx(cfg.weight_decay)
    assert args["warmup_length"] == cfg.warmup_steps
    assert args["epochs"] == cfg.epochs
    assert args["batch_size"] == cfg.batch_size
    assert args["ls"] == 0.0  # no label smoothing: the suite's plain cross-entropy
