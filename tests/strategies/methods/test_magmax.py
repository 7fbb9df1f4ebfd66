"""MagMax: the max-magnitude merge against a batch reference (ties included), the invariants of
docs/baselines.md §7, its parameter count on ViT-B/16, and exact save/load and resume."""

import pytest
import torch

from benchmarks.backbone.full_tuning import difference, max_magnitude, visual_state
from benchmarks.data.class_orders import resolve_class_order
from benchmarks.data.streams import build_stream
from benchmarks.data.transforms import eval_transform
from strategies.methods.magmax import MagMax, merged
from strategies.settings import RunSettings
from tests.helpers import killed_and_resumed, run_one_run_suite, strategy_from_suite, three_task_suite

SUITE = three_task_suite(
    "magmax",
    'epochs = 1\nbatch_size = 16\neval_batch_size = 100\nlr = 1e-4\nwarmup_steps = 2\nprompt_ensemble = ""',
    augmentation="rrc90",
)


def test_incremental_merge_equals_the_batch_rule_with_ties_to_the_later_task():
    torch.manual_seed(0)
    taus = [{"w": torch.randint(-3, 4, (200,)).float()} for _ in range(4)]  # small integers: many ties
    running = None
    for tau in taus:
        running = max_magnitude(running, tau)
    stacked = torch.stack([t["w"] for t in taus])
    last_of_max = (
        len(taus) - 1 - stacked.abs().flip(0).argmax(dim=0)
    )  # argmax takes the first: flip for the last
    assert torch.equal(running["w"], stacked.gather(0, last_of_max[None])[0])
    tie = {"w": torch.tensor([2.0])}, {"w": torch.tensor([-2.0])}
    assert max_magnitude(max_magnitude(None, tie[0]), tie[1])["w"].item() == -2.0  # the later task wins


@pytest.mark.slow
def test_trainable_parameters_on_vit_b16_are_the_visual_tower(vit_b16):
    torch.manual_seed(0)
    backbone = vit_b16
    strategy = MagMax(
        backbone=backbone,
        class_names=["a", "b"],
        config=MagMax.Config(prompt_ensemble=""),
        settings=RunSettings(show_progress=False),
    )
    assert strategy.trainable_parameter_count() == 86_192_640


@pytest.fixture(scope="module")
def magmax_run(tmp_path_factory):
    return run_one_run_suite(tmp_path_factory.mktemp("magmax"), SUITE, "--save-models")


@pytest.mark.slow
def test_one_task_gives_the_midpoint_text_stays_frozen_and_task_2_starts_from_theta_1(magmax_run):
    suite, _, _ = magmax_run
    strategy, spec, data = strategy_from_suite(suite)
    stream = build_stream(
        data,
        3,
        resolve_class_order(spec.class_order, 15, "synthetic"),
        eval_transform(32),
        eval_transform(32),
    )
    text_before = {k: v.clone() for k, v in strategy.backbone.model.transformer.state_dict().items()}
    with torch.no_grad():
        head_before = strategy.text_features(list(range(15)))
    theta_0 = visual_state(strategy.backbone.model)
    torch.manual_seed(0)
    strategy.learn(stream.train_stream[0])
    theta_1 = strategy.theta
    assert any(not torch.equal(theta_1[k], theta_0[k]) for k in theta_0)  # training moved the tower
    now = visual_state(strategy.backbone.model)
    assert all(torch.allclose(now[k], (theta_0[k] + theta_1[k]) / 2, atol=1e-6) for k in theta_0)
    assert all(
        torch.equal(v, text_before[k]) for k, v in strategy.backbone.model.transformer.state_dict().items()
    )
    with torch.no_grad():
        assert torch.equal(strategy.text_features(list(range(15))), head_before)
    strategy.setup_task(1, stream.tasks[1])
    assert all(torch.equal(v, theta_1[k]) for k, v in visual_state(strategy.backbone.model).items())
    assert torch.equal(strategy.tau_run["conv1.weight"], difference(theta_1, theta_0)["conv1.weight"])


def test_save_load_restores_the_merged_model(magmax_run):
    suite, results, result = magmax_run
    assert all(s["routing_acc"] >= s["acc"] for s in result["stages"])
    strategy, _, data = strategy_from_suite(suite)
    strategy.load_model(results / "synthetic" / "magmax" / "T3-seed0.model")
    expected = merged(strategy.theta_0, strategy.tau_run, 0.5)
    assert all(torch.equal(v, expected[k]) for k, v in visual_state(strategy.backbone.model).items())


def test_killed_run_resumes_with_identical_results(magmax_run, tmp_path, monkeypatch):
    suite, _, reference = magmax_run
    resumed = killed_and_resumed(monkeypatch, MagMax, suite, tmp_path, task=2)
    assert resumed["stages"] == reference["stages"]
