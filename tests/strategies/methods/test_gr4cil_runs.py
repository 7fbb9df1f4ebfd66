"""GR4CIL end to end on a small offline stream: diagnostics, cost, caching of branch features,
deployed batched inference, saving and loading, and exact resumption."""

import json

import numpy as np
import pytest
import torch
from safetensors import safe_open

from benchmarks.backbone import BackboneSpec, create_clip
from benchmarks.core.errors import UserError
from benchmarks.runner import building
from benchmarks.runner.suites import expand, load_suite
from strategies.methods.gr4cil import GR4CIL
from strategies.settings import RunSettings
from tests.helpers import killed_and_resumed, run_one_run_suite

SUITE = """
datasets = ["synthetic"]
tasks = [4]
seeds = [0]
strategies = ["gr4cil"]
device = "cpu"
zero_shot_targets = ["synthetic"]
[backbone]
model = "tiny-clip-32"
pretrained = "synthetic"
[dataset.synthetic]
n_classes = 20
n_train_per_class = 12
n_test_per_class = 5
[defaults]
batch_size = 16
eval_batch_size = 100
lora_rank = 4
lora_alpha = 4.0
[strategy.gr4cil]
epochs = 2
compensation_epochs = 1
threshold_holdout = 0.25
"""
N_TEST = 20 * 5


@pytest.fixture(scope="module")
def gr4cil_run(tmp_path_factory):
    return run_one_run_suite(tmp_path_factory.mktemp("gr4cil"), SUITE, "--save-models")


@pytest.mark.slow
def test_stages_have_routing_at_least_accuracy_and_the_diagnostics(gr4cil_run):
    _, _, result = gr4cil_run
    for stage in result["stages"]:
        assert stage["routing_acc"] >= stage["acc"]
        diagnostics = stage["diagnostics"]
        assert diagnostics["routing_acc_full"] == pytest.approx(stage["routing_acc"])
        for key in (
            "routing_acc_text_only",
            "routing_acc_text_prototype",
            "confidence_with_compensation",
            "confidence_without_compensation",
        ):
            assert diagnostics[key] is not None
        assert (diagnostics["margin_with_compensation"] is None) == (stage["task"] == 1)
    run_diagnostics = result["diagnostics"]
    assert 0.0 < run_diagnostics["anchor_preservation"] <= 1.0 + 1e-6
    assert set(run_diagnostics["subspace_distance"]) == {"I-T", "I-C", "I-TC"}
    # the joint text + compensation space covers image directions at least as well as either part
    d = run_diagnostics["subspace_distance"]
    assert d["I-TC"] <= min(d["I-T"], d["I-C"]) + 1e-6
    assert [len(epochs) for epochs in run_diagnostics["modality_gap"]] == [2, 2, 2, 2]
    assert all(t is not None and 0 < t < 1 for t in run_diagnostics["thresholds"])


def test_zero_shot_interface_reports_clip_fusion_and_routed_accuracy(gr4cil_run):
    _, _, result = gr4cil_run
    zero_shot = result["zero_shot"]["synthetic"]
    assert zero_shot["n_test"] == 100 * 20
    for key in ("clip", "fusion", "routed", "unknown_rate"):
        assert 0.0 <= zero_shot[key] <= 100.0
    assert result["config"]["zero_shot_targets"] == ["synthetic"]


def test_evaluation_encodes_each_test_image_once_per_branch(gr4cil_run):
    _, _, result = gr4cil_run
    # 4 branches, each pushed over the whole test set once, reused at every later stage
    assert result["diagnostics"]["eval_branch_forwards"] == 4 * N_TEST


def test_trainable_parameters_are_counted_as_in_the_appendix(gr4cil_run):
    _, results, result = gr4cil_run
    path = results / "synthetic" / "gr4cil" / "T4-seed0.model.safetensors"
    with safe_open(str(path), "pt") as f:
        keys = list(f.keys())
        sizes = {k: f.get_tensor(k).numel() for k in keys}
    lora = sum(v for k, v in sizes.items() if k.startswith("lora/"))
    adapters = {k.split("/")[1] for k in keys if k.startswith("lora/")}
    assert adapters == {"text", "visual_1", "visual_2", "visual_3", "visual_4"}
    d = 256  # embed_dim of tiny-clip-32
    heads_and_prototypes = 4 * (2 * d * 5)  # per task: W_hat (d x 5) + prototypes (5 x d)
    anchors = 20 * d
    assert result["cost"]["trainable_params"] == lora + heads_and_prototypes + anchors


def test_saved_model_keys_are_documented_and_loading_restores_the_scores(gr4cil_run):
    suite, results, result = gr4cil_run
    stem = results / "synthetic" / "gr4cil" / "T4-seed0.model"
    with safe_open(str(stem) + ".safetensors", "pt") as f:
        keys = set(f.keys())
        basis = f.get_tensor("state/tasks/0/text_basis")
        head = f.get_tensor("state/tasks/0/head")
    for i in range(4):
        assert {f"state/tasks/{i}/text_basis", f"state/tasks/{i}/head", f"state/tasks/{i}/prototypes"} <= keys
    assert "state/anchors" in keys
    assert (basis.T @ head).abs().max() < 1e-5  # W_hat stays orthogonal to the text span
    meta = json.loads((stem.parent / "T4-seed0.model.json").read_text())
    assert meta["strategy"] == "gr4cil" and len(meta["class_names"]) == 20
    kinds = meta["state"]["state_kinds"]  # the tasks' class ids and the anchors' are in the JSON
    assert [len(task["class_ids"]) for task in kinds["tasks"]["items"]] == [5, 5, 5, 5]
    assert len(kinds["anchor_ids"]["value"]) == 20

    spec = expand(load_suite(str(suite)))[0]
    data = building.load_run_data(spec, "data")
    torch.manual_seed(0)
    backbone = create_clip(BackboneSpec("tiny-clip-32", None))
    strategy = GR4CIL(
        backbone=backbone,
        class_names=data.class_names,
        config=GR4CIL.Config.from_dict(spec.strategy_options),
        settings=RunSettings(show_progress=False),
    )
    strategy.load_model(stem)
    assert strategy.seen_classes == [c for task in result["tasks"] for c in sorted(task)]
    from benchmarks.data.transforms import eval_transform

    transform = eval_transform(32)
    images = torch.stack([transform(data.test[i][0]) for i in range(8)])
    strategy.backbone.set_adapters(visual=None, text="text")
    with torch.no_grad():
        batched = strategy.scores(images)  # all branches in one forward (deployed inference)
        one_by_one = strategy._scores_from_features(
            [strategy.encode_dataset([(img, 0) for img in images], t.adapter)[0] for t in strategy.tasks],
            strategy.text_features(strategy.seen_classes),
        )
    torch.testing.assert_close(batched, one_by_one, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_killed_gr4cil_run_resumes_with_identical_results(gr4cil_run, tmp_path, monkeypatch):
    suite, _, reference = gr4cil_run
    resumed = killed_and_resumed(monkeypatch, GR4CIL, suite, tmp_path, task=3)
    for a, b in zip(resumed["stages"], reference["stages"]):
        assert {k: v for k, v in a.items()} == {k: v for k, v in b.items()}
    ignore = {"eval_branch_forwards"}  # a resumed run re-encodes the branches of finished tasks once
    assert {k: v for k, v in resumed["diagnostics"].items() if k not in ignore} == {
        k: v for k, v in reference["diagnostics"].items() if k not in ignore
    }
    assert np.isclose(resumed["summary"]["last_acc"], reference["summary"]["last_acc"])


def test_chunked_text_backward_gives_the_same_gradients_as_the_direct_one():
    torch.manual_seed(0)
    names = [f"class {i}" for i in range(12)]
    gradients = []
    for chunk in (256, 5):  # direct graph, then 12 prompts in chunks of 5
        torch.manual_seed(0)
        backbone = create_clip(BackboneSpec("tiny-clip-32", None))
        strategy = GR4CIL(
            backbone=backbone,
            class_names=names,
            config=GR4CIL.Config(lora_rank=4, lora_alpha=4.0, text_chunk_size=chunk, tau=0.0),
            settings=RunSettings(show_progress=False),
        )
        strategy.setup_task(0, list(range(4)))
        for p in strategy.backbone.lora_parameters("text") + strategy.backbone.lora_parameters("visual_1"):
            torch.nn.init.normal_(p, std=0.1)  # non-zero B so every LoRA parameter gets a gradient
        strategy.seen_classes, strategy.current_classes = list(range(8)), list(range(8, 12))
        strategy.anchors = torch.nn.functional.normalize(
            torch.randn(8, backbone.embed_dim, generator=torch.Generator().manual_seed(1)), dim=1
        )
        images = torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(2))
        logits = strategy.compute_logits(images)
        strategy.loss = strategy.compute_loss(logits, torch.tensor([0, 1, 2, 3, 0, 1]))
        strategy.backward()
        params = strategy.backbone.lora_parameters("text") + strategy.backbone.lora_parameters("visual_1")
        gradients.append([p.grad.clone() for p in params])
    for direct, chunked in zip(*gradients):
        torch.testing.assert_close(chunked, direct, atol=1e-6, rtol=1e-4)


def test_images_per_forward_option_resolves_auto_and_rejects_bad_values():
    backbone = create_clip(BackboneSpec("tiny-clip-32", None))

    def strategy(cap):
        return GR4CIL(
            backbone=backbone,
            class_names=["a", "b"],
            config=GR4CIL.Config(max_images_per_forward=cap),
            settings=RunSettings(show_progress=False),
        )

    assert strategy("auto").images_per_forward() == backbone.efficient_images_per_forward() == 240
    assert strategy(0).images_per_forward() == 0 and strategy(64).images_per_forward() == 64
    for bad in (-1, "many", 2.5, True):
        with pytest.raises(UserError, match="max_images_per_forward"):
            GR4CIL.Config(max_images_per_forward=bad)
