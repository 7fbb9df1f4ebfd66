"""AdapterVLM: its equations by hand, the invariants of docs/baselines.md §4, its parameter count
on ViT-B/16, and exact save/load and resume on a small offline stream."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from benchmarks.data.transforms import PatchShuffle, eval_transform
from strategies.methods.adaptervlm import AdapterVLM, distance_loss, prototype, task_scores
from strategies.settings import RunSettings
from tests.helpers import killed_and_resumed, run_one_run_suite, strategy_from_suite, three_task_suite

SUITE = three_task_suite("adaptervlm", "epochs = 2\nbatch_size = 16\neval_batch_size = 100\nlora_rank = 4")


def test_distance_loss_by_hand():
    """Three unit vectors with cosines 0.8 (1, 2), 0 (1, 3) and 0.6 (2, 3); tau = 0.5."""
    text = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
    # task 1, all three new: ordered pairs give 0.3 + 0 + 0.3 + 0.1 + 0 + 0.1, over n (n - 1) = 6
    first = distance_loss(text, text, torch.arange(3), tau=0.5)
    assert float(first) == pytest.approx(0.8 / 6)
    # a later task: class 3 is new, 1 and 2 are old: (0 + 0.1) over n_new (n_new + n_old) - n_new = 2
    later = distance_loss(text[2:], text, torch.tensor([2]), tau=0.5)
    assert float(later) == pytest.approx(0.05)


def test_prototype_is_the_normalised_sum_of_raw_embeddings():
    raw = torch.tensor([[3.0, 0.0], [0.0, 1.0]])  # the mean of normalised rows would point at 45 degrees
    assert torch.allclose(prototype(raw), torch.tensor([3.0, 1.0]) / math.sqrt(10))


def test_flat_argmax_equals_the_task_then_class_argmax():
    torch.manual_seed(0)
    image = F.normalize(torch.randn(50, 8), dim=-1)
    tasks = [
        (F.normalize(torch.randn(3, 8), dim=-1), F.normalize(torch.randn(3, 8), dim=-1)) for _ in range(4)
    ]
    q = [task_scores(image, p, t, 1.0, 1.0) for p, t in tasks]
    flat = torch.cat(q, dim=1).argmax(dim=1)
    best_task = torch.stack([s.max(dim=1).values for s in q], dim=1).argmax(dim=1)
    two_level = torch.stack([3 * k + q[k][i].argmax() for i, k in enumerate(best_task.tolist())])
    assert torch.equal(flat, two_level)


def test_patch_shuffle_moves_patches_only_and_is_deterministic():
    pixels = np.random.RandomState(0).randint(0, 256, (32, 32, 3), dtype=np.uint8)
    shuffled = np.asarray(PatchShuffle(8)(Image.fromarray(pixels)))
    assert np.array_equal(np.sort(pixels.ravel()), np.sort(shuffled.ravel()))

    def patches(a):
        return sorted(a[r : r + 4, c : c + 4].tobytes() for r in range(0, 32, 4) for c in range(0, 32, 4))

    assert patches(pixels) == patches(shuffled) and not np.array_equal(pixels, shuffled)
    assert np.array_equal(shuffled, np.asarray(PatchShuffle(8)(Image.fromarray(pixels))))


@pytest.mark.slow
def test_trainable_parameters_on_vit_b16_match_the_count_of_baselines_md(vit_b16):
    """Ten visual LoRAs of 884,736, one text LoRA of 589,824 and 100 prototypes of 512: 9,488,384."""
    torch.manual_seed(0)
    backbone = vit_b16
    strategy = AdapterVLM(
        backbone=backbone,
        class_names=[f"c{i}" for i in range(100)],
        config=AdapterVLM.Config(),
        settings=RunSettings(show_progress=False),
    )
    strategy.add_adapter("text", "text")
    for task in range(10):
        strategy.add_adapter(f"visual_{task + 1}", "visual")
        strategy.prototypes.append(torch.zeros(10, backbone.embed_dim))
    assert strategy.trainable_parameter_count() == 9_488_384


@pytest.fixture(scope="module")
def adaptervlm_run(tmp_path_factory):
    return run_one_run_suite(tmp_path_factory.mktemp("adaptervlm_run"), SUITE, "--save-models")


def _strategy(suite, **options):
    return strategy_from_suite(suite, **options)


@pytest.mark.slow
def test_run_routes_at_least_as_well_as_it_classifies(adaptervlm_run):
    _, _, result = adaptervlm_run
    assert result["strategy"] == "adaptervlm" and len(result["stages"]) == 3
    assert all(s["routing_acc"] >= s["acc"] for s in result["stages"])
    d = 256  # the joint embedding of tiny-clip-32
    lora = 4 * 2 * (4 * 64 + 64 * 4)  # text: 4 blocks x (k, v) x (A: 4 x 64, B: 64 x 4)
    lora += 3 * 4 * 2 * (4 * 128 + 128 * 4)  # three visual LoRAs on width 128
    assert result["cost"]["trainable_params"] == lora + 15 * d


@pytest.mark.slow
def test_frozen_branch_keeps_its_scores_and_a_new_branch_starts_as_a_copy(adaptervlm_run):
    suite, _, _ = adaptervlm_run
    strategy, spec, data = _strategy(suite, beta=0.0)
    from benchmarks.data.class_orders import resolve_class_order
    from benchmarks.data.streams import build_stream
    from benchmarks.data.transforms import train_transform

    stream = build_stream(
        data,
        3,
        resolve_class_order(spec.class_order, 15, "synthetic"),
        train_transform(32, augmentation="paper-scaled"),
        eval_transform(32),
    )
    torch.manual_seed(0)
    strategy.learn(stream.train_stream[0])
    after_task_1 = strategy.evaluate_dataset(stream.test_set)
    strategy.learn(stream.train_stream[1])
    after_task_2 = strategy.evaluate_dataset(stream.test_set)
    # with no text term, task 1's columns depend only on its frozen branch and prototypes
    assert torch.equal(after_task_2[:, :5], after_task_1)
    strategy.setup_task(2, stream.tasks[2])
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            strategy.backbone.lora_state_dict("visual_2").values(),
            strategy.backbone.lora_state_dict("visual_3").values(),
        )
    )


def test_save_load_gives_identical_scores(adaptervlm_run):
    suite, results, result = adaptervlm_run
    strategy, spec, data = _strategy(suite)
    strategy.load_model(results / "synthetic" / "adaptervlm" / "T3-seed0.model")
    assert strategy.branches == ["visual_1", "visual_2", "visual_3"] and len(strategy.anchor_ids) == 15
    transform = eval_transform(32)
    images = torch.stack([transform(data.test[i][0]) for i in range(6)])
    with torch.no_grad():
        batched = strategy.scores(images)
        one_by_one = strategy._scores_from_features(
            [strategy.encode_dataset([(img, 0) for img in images], b)[0] for b in strategy.branches],
            strategy.text_features(strategy.seen_classes),
        )
    torch.testing.assert_close(batched, one_by_one, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_killed_run_resumes_with_identical_results(adaptervlm_run, tmp_path, monkeypatch):
    suite, _, reference = adaptervlm_run
    resumed = killed_and_resumed(monkeypatch, AdapterVLM, suite, tmp_path, task=2)
    assert resumed["stages"] == reference["stages"]
