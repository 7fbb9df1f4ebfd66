"""APER-Adapter (docs/baselines.md §12): the adapted tower equals the pretrained one at
initialisation, adapters train on task 1 only, prototypes are class means of [base, adapted],
scores are cosines to them, the parameter count, and a run with exact save/load and resume."""

import pytest
import torch
import torch.nn.functional as F

from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
from benchmarks.backbone.mlp_adapters import mlp_adapter_parameter_count
from strategies.methods.aper_adapter import AperAdapter
from strategies.settings import RunSettings
from tests.helpers import check_save_load_and_resume, run_one_run_suite, strategy_and_stream, three_task_suite

SUITE = three_task_suite(
    "aper_adapter", "epochs = 3\nbatch_size = 20\neval_batch_size = 100\nlr = 0.05", augmentation="none"
)


def test_the_adapted_tower_equals_the_pretrained_one_at_initialisation(tmp_path):
    strategy, stream = strategy_and_stream(tmp_path, SUITE)
    images = torch.stack([stream.test_set[i][0] for i in range(4)])
    phi = strategy.phi(images)
    d = strategy.backbone.embed_dim
    assert torch.equal(phi[:, :d], phi[:, d:])


def test_adapters_train_on_task_one_only_and_prototypes_are_class_means(tmp_path):
    strategy, stream = strategy_and_stream(tmp_path, SUITE)
    initial = [p.detach().clone() for p in strategy.backbone.mlp_adapter_parameters()]
    strategy.learn(stream.train_stream[0])
    after_first = [p.detach().clone() for p in strategy.backbone.mlp_adapter_parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(initial, after_first, strict=True))
    strategy.learn(stream.train_stream[1])
    assert all(
        torch.equal(a, b)
        for a, b in zip(after_first, strategy.backbone.mlp_adapter_parameters(), strict=True)
    )
    # prototypes of task 2: the mean of [base, adapted] over each class's training images, eval transform
    train = stream.train_stream[1].dataset.eval()
    images = torch.stack([train[i][0] for i in range(len(train))])
    labels = torch.tensor([int(train[i][1]) for i in range(len(train))])
    with torch.no_grad(), strategy.backbone.mlp_adapters(enabled=False):
        base = strategy.backbone.encode_image(images, normalize=False)
    with torch.no_grad():
        phi = torch.cat([base, strategy.backbone.encode_image(images, normalize=False)], dim=1)
    for row, c in enumerate(stream.tasks[1]):
        torch.testing.assert_close(
            strategy.prototypes[5 + row], phi[labels == c].mean(0), atol=1e-5, rtol=1e-5
        )
    tests = torch.stack([stream.test_set[i][0] for i in range(6)])
    expected = F.normalize(strategy.phi(tests), dim=-1) @ F.normalize(strategy.prototypes, dim=-1).T
    torch.testing.assert_close(strategy.scores(tests), expected, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_trainable_parameters_match_baselines_md(vit_b16):
    assert mlp_adapter_parameter_count(768, 12, 1, 64, False) == 1_189_632
    torch.manual_seed(0)
    vit = AperAdapter(
        backbone=vit_b16,
        class_names=[str(c) for c in range(100)],
        config=AperAdapter.Config(),
        settings=RunSettings(show_progress=False),
    )
    vit.prototypes = torch.zeros(100, 1024)  # after the last task
    assert vit.trainable_parameter_count() == 1_292_032
    tiny = AperAdapter(
        backbone=create_clip(BackboneSpec(TINY_MODEL, "synthetic")),
        class_names=["a", "b"],
        config=AperAdapter.Config(),
        settings=RunSettings(show_progress=False),
    )
    assert {p for p in tiny.backbone.parameters() if p.requires_grad} == set(
        tiny.backbone.mlp_adapter_parameters()
    )


@pytest.fixture(scope="module")
def aper_run(tmp_path_factory):
    return run_one_run_suite(tmp_path_factory.mktemp("aper"), SUITE, "--save-models")


@pytest.mark.slow
def test_a_run_learns_and_saves_and_resumes_exactly(aper_run, tmp_path, monkeypatch):
    assert aper_run[2]["summary"]["last_acc"] > 100 / 15 * 2
    loaded = check_save_load_and_resume(aper_run, AperAdapter, tmp_path, monkeypatch)
    assert loaded.prototypes.shape == (15, 2 * 256)  # [pretrained, adapted] 256-d features
