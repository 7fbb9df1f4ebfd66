"""MG-CLIP: the fusion and the epoch rule by hand, the invariants of docs/baselines.md §5, its
parameter count on ViT-B/16, the "auto" probe, and exact save/load and resume."""

import pytest
import torch
import torch.nn.functional as F

from benchmarks.data.class_orders import resolve_class_order
from benchmarks.data.streams import build_stream
from benchmarks.data.transforms import eval_transform
from strategies.methods.mg_clip import MGCLIP, fused_scores, gap_epoch_budget, mean_non_target_logit
from strategies.settings import RunSettings
from tests.helpers import killed_and_resumed, run_one_run_suite, strategy_from_suite, three_task_suite

SUITE = three_task_suite(
    "mg_clip",
    "epochs = 2\nbatch_size = 16\neval_batch_size = 100\nvisual_batch_size = 16",
    augmentation="none",
)


def test_fused_scores_by_hand():
    image = torch.tensor([[1.0, 0.0]])
    text = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    classifier = torch.tensor([[2.0, 0.0], [1.0, 1.0]])  # rows are normalised: cosines 1 and 1/sqrt 2
    p_text = torch.softmax(torch.tensor([10.0, 0.0]), 0)
    p_vis = torch.softmax(torch.tensor([1.0, 2**-0.5]), 0)
    expected = (torch.softmax(p_text, 0) + 4 * p_vis) / 5
    assert torch.allclose(fused_scores(image, text, classifier, logit_scale=10.0)[0], expected)
    assert torch.allclose(fused_scores(image, text, classifier, 10.0).sum(), torch.tensor(1.0))


def test_epoch_budget_rule_on_scripted_negatives():
    # untrained mean non-target logit 20; threshold 10 %
    assert gap_epoch_budget([20.5, 21.0, 23.0], 20.0, 0.10, fallback=10) == 2  # epoch 3 moved 15 %
    assert gap_epoch_budget([25.0], 20.0, 0.10, fallback=10) == 1  # the first epoch already moved: at least 1
    assert gap_epoch_budget([20.1, 19.5, 21.9], 20.0, 0.10, fallback=10) == 10  # never crossed: the fallback
    logits = torch.tensor([[5.0, 1.0, 2.0], [0.0, 4.0, 6.0]])
    assert mean_non_target_logit(logits, torch.tensor([0, 2])) == (7.0, 4)  # (1 + 2) + (0 + 4)


@pytest.mark.slow
def test_trainable_parameters_on_vit_b16_match_the_count_of_baselines_md(vit_b16):
    torch.manual_seed(0)
    backbone = vit_b16
    strategy = MGCLIP(
        backbone=backbone,
        class_names=[f"c{i}" for i in range(100)],
        config=MGCLIP.Config(),
        settings=RunSettings(show_progress=False),
    )
    strategy.setup_task(0, list(range(10)))
    layer = backbone.model.visual.transformer.resblocks[0].attn.k_proj
    assert layer.scaling["mg_visual"] == pytest.approx(1 / 8)
    strategy.classifier = torch.zeros(100, backbone.embed_dim)
    assert strategy.trainable_parameter_count() == 542_720  # 294,912 + 196,608 + 51,200


@pytest.fixture(scope="module")
def mg_run(tmp_path_factory):
    return run_one_run_suite(tmp_path_factory.mktemp("mg_run"), SUITE, "--save-models")


def _strategy_and_stream(suite, **options):
    strategy, spec, data = strategy_from_suite(suite, **options)
    stream = build_stream(
        data,
        3,
        resolve_class_order(spec.class_order, 15, "synthetic"),
        eval_transform(32),
        eval_transform(32),
    )
    return strategy, stream


@pytest.mark.slow
def test_new_lora_is_frozen_clip_and_old_classifier_rows_never_move(mg_run):
    suite, _, _ = mg_run
    strategy, stream = _strategy_and_stream(suite)
    images = torch.stack([stream.test_set[i][0] for i in range(4)])
    with torch.no_grad():
        base = strategy.backbone.encode_image(images)
    torch.manual_seed(0)
    strategy.learn(stream.train_stream[0])
    rows = strategy.classifier.clone()
    strategy.learn(stream.train_stream[1])
    assert torch.equal(strategy.classifier[:5], rows) and strategy.classifier.shape[0] == 10
    fresh, _ = _strategy_and_stream(suite)
    fresh.setup_task(0, stream.tasks[0])
    with torch.no_grad():  # xavier A, B = 0: the identity
        assert torch.equal(fresh.backbone.encode_image(images), base)
        assert not torch.equal(strategy.backbone.encode_image(images), base)  # training moved the shared LoRA


def test_auto_epochs_run_the_probe_once_and_restore_the_lora(mg_run):
    suite, _, _ = mg_run
    strategy, stream = _strategy_and_stream(suite, epochs="auto", probe_epochs=3, probe_threshold=1e-6)
    torch.manual_seed(0)
    strategy.adapted_dataset = stream.train_stream[0].dataset.train()  # what the training loop sets first
    strategy.current_classes = sorted(stream.tasks[0])
    strategy._local_index = torch.full((15,), -1, dtype=torch.long)
    strategy._local_index[strategy.current_classes] = torch.arange(5)
    strategy.setup_task(0, strategy.current_classes)
    assert strategy.auto_epochs == 1 and strategy.train_epochs == 1  # any change crosses a tiny threshold
    assert len(strategy.probe_negatives) == 2  # untrained, then one epoch
    assert all(
        not b.any() for k, b in strategy.backbone.lora_state_dict("mg_visual").items() if k.endswith("lora_B")
    )


def test_scores_are_fused_probabilities_and_save_load_restores_them(mg_run):
    suite, results, result = mg_run
    assert all(s["routing_acc"] >= s["acc"] for s in result["stages"])
    strategy, stream = _strategy_and_stream(suite)
    strategy.load_model(results / "synthetic" / "mg_clip" / "T3-seed0.model")
    images = torch.stack([stream.test_set[i][0] for i in range(6)])
    with torch.no_grad():
        scores = strategy.scores(images)
        image = strategy.backbone.encode_image(images)
        text = strategy.text_features(strategy.seen_classes)
    p_text = torch.softmax(strategy.backbone.logit_scale * image @ text.T, dim=1)
    expected = (
        torch.softmax(p_text, dim=1) + 4 * torch.softmax(image @ F.normalize(strategy.classifier).T, dim=1)
    ) / 5
    torch.testing.assert_close(scores, expected, atol=1e-6, rtol=0)
    assert torch.allclose(scores.sum(dim=1), torch.ones(6), atol=1e-6)


@pytest.mark.slow
def test_killed_run_resumes_with_identical_results(mg_run, tmp_path, monkeypatch):
    suite, _, reference = mg_run
    resumed = killed_and_resumed(monkeypatch, MGCLIP, suite, tmp_path, task=2)
    assert resumed["stages"] == reference["stages"]
