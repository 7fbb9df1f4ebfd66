"""Avalanche's own strategies through the runner (strategies/frameworks/avalanche.py): options from
the template's signature, the cosine head at zero-shot CLIP, LwF, EWC and replay acting inside the
suite's stream, resuming where the state allows it, and a relabelled Avalanche benchmark read
through its class mapping."""

import warnings

import numpy as np
import pytest
import torch
from avalanche.benchmarks.scenarios.deprecated.generators import nc_benchmark
from avalanche.benchmarks.utils import DataAttribute
from avalanche.benchmarks.utils.classification_dataset import TaskAwareSupervisedClassificationDataset
from avalanche.evaluation.metrics import accuracy_metrics
from avalanche.training.plugins import EvaluationPlugin

from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
from benchmarks.core.errors import UserError
from benchmarks.data.datasets import load_dataset
from benchmarks.data.transforms import eval_transform
from strategies.registry import get_strategy
from strategies.settings import RunSettings
from tests.helpers import killed_and_resumed, run_one_run_suite, three_task_suite

TINY = {"batch_size": 16, "eval_batch_size": 64, "epochs": 2, "lr": 0.01}


def test_options_are_the_templates_keyword_arguments_with_avalanches_defaults():
    lwf, ewc, replay = (get_strategy(f"avalanche:{n}").Config for n in ("LwF", "EWC", "Replay"))
    assert {"alpha", "temperature", "head", "encoder", "epochs"} <= set(lwf.__dataclass_fields__)
    assert (ewc.__dataclass_fields__["mode"].default, replay.__dataclass_fields__["mem_size"].default) == (
        "separate",
        200,
    )
    with pytest.raises(UserError) as err:
        lwf.from_dict({"alpha": 1.0}, "avalanche:LwF")
    assert str(err.value) == (
        "avalanche:LwF needs option(s) temperature (Avalanche has no default); set them in the suite's "
        '[strategy."avalanche:LwF"] table'
    )
    assert lwf.from_dict({"alpha": 1.0, "temperature": 2.0}).temperature == 2.0


def test_the_cosine_head_starts_at_zero_shot_clip():
    cls = get_strategy("avalanche:Naive")
    backbone = create_clip(BackboneSpec(TINY_MODEL, "synthetic"))
    names = ["cat", "dog", "car", "tree"]
    strategy = cls(
        backbone=backbone,
        class_names=names,
        config=cls.Config(head="cosine"),
        settings=RunSettings(show_progress=False),
    )
    strategy.seen_classes = [2, 0]
    images = torch.randn(5, 3, 32, 32)
    with torch.no_grad():
        text = backbone.encode_text(backbone.tokenize([f"a photo of a {n}." for n in names]), normalize=True)
        image = backbone.encode_image(images, normalize=True)
    expected = backbone.logit_scale * image @ text[[2, 0]].T
    torch.testing.assert_close(strategy.scores(images), expected, rtol=1e-5, atol=1e-4)


def _suite(options: dict) -> str:
    lines = "\n".join(f"{k} = {v!r}" for k, v in {**TINY, **options}.items())
    return lines.replace("'", '"')


@pytest.fixture(scope="module")
def naive(tmp_path_factory):
    return run_one_run_suite(
        tmp_path_factory.mktemp("naive"), three_task_suite("avalanche:Naive", _suite({}))
    )


@pytest.mark.parametrize(
    "name, options",
    [
        ("LwF", {"alpha": 10.0, "temperature": 2.0}),
        ("EWC", {"ewc_lambda": 1e4}),
        ("Replay", {"mem_size": 30}),
    ],
)
def test_lwf_ewc_and_replay_act_inside_the_suites_stream(name, options, naive, tmp_path):
    """The first task trains as Naive does (the plugins have nothing to keep yet), later ones differ."""
    *_, result = run_one_run_suite(tmp_path, three_task_suite(f"avalanche:{name}", _suite(options)))
    reference = naive[2]
    assert result["stages"][0] == reference["stages"][0]
    assert result["stages"][2]["acc"] != reference["stages"][2]["acc"]
    assert result["class_order"] == reference["class_order"]


def test_naive_resumes_from_its_checkpoint_and_lwf_starts_again(naive, tmp_path, monkeypatch):
    suite, _, reference = naive
    resumed = killed_and_resumed(
        monkeypatch, get_strategy("avalanche:Naive"), suite, tmp_path / "naive", task=3
    )
    assert resumed["stages"] == reference["stages"]

    lwf = tmp_path / "lwf.toml"
    lwf.write_text(three_task_suite("avalanche:LwF", _suite({"alpha": 1.0, "temperature": 2.0})))
    from benchmarks import run

    assert run.main(["--suite", str(lwf), "--results-dir", str(tmp_path / "straight"), "--quiet"]) == 0
    straight = next((tmp_path / "straight").rglob("T3-seed0.json")).read_text()
    again = killed_and_resumed(monkeypatch, get_strategy("avalanche:LwF"), lwf, tmp_path / "again", task=3)
    import json

    assert again["stages"] == json.loads(straight)["stages"]


def test_a_lora_encoder_trains_and_is_checkpointed(tmp_path):
    cls = get_strategy("avalanche:Naive")
    suite = three_task_suite("avalanche:Naive", _suite({"encoder": "lora", "head": "cosine", "lora_rank": 2}))
    *_, result = run_one_run_suite(tmp_path, suite)
    assert result["cost"]["trainable_params"] > 64 * 15  # the head and the LoRA
    strategy = cls(
        backbone=create_clip(BackboneSpec(TINY_MODEL, "synthetic")),
        class_names=[str(i) for i in range(4)],
        config=cls.Config(encoder="lora", lora_rank=2),
        settings=RunSettings(show_progress=False),
    )
    tensors, _ = strategy.checkpoint_state()
    assert any("lora" in key for key in tensors) and any("head" in key for key in tensors)


def _avalanche_dataset(images, targets):
    return TaskAwareSupervisedClassificationDataset(
        [images],
        transform_groups={"train": (eval_transform(32), None), "eval": (eval_transform(32), None)},
        data_attributes=[
            DataAttribute(list(targets), "targets"),
            DataAttribute([0] * len(targets), "targets_task_labels", use_in_getitem=True),
        ],
    )


@pytest.mark.slow
def test_a_relabelled_benchmark_is_read_through_its_class_mapping():
    """``class_ids_from_zero_from_first_exp=True`` renumbers the classes; every prompt still names its
    class, so fine-tuning learns exactly what it learns on the same benchmark without the renumbering."""
    data = load_dataset("synthetic", n_classes=8, n_train_per_class=6, n_test_per_class=4, domain="faded")
    train, test = (
        _avalanche_dataset(data.train, data.train_targets),
        _avalanche_dataset(data.test, data.test_targets),
    )
    order = [5, 2, 7, 0, 3, 1, 6, 4]
    accuracies = {}
    for relabel in (False, True):
        benchmark = nc_benchmark(
            train,
            test,
            2,
            task_labels=False,
            fixed_class_order=order,
            class_ids_from_zero_from_first_exp=relabel,
        )
        cls = get_strategy("finetune")
        torch.manual_seed(0)
        evaluator = EvaluationPlugin(accuracy_metrics(experience=True), loggers=[])
        strategy = cls(
            backbone=create_clip(BackboneSpec(TINY_MODEL, "synthetic")),
            class_names=data.class_names,
            config=cls.Config(epochs=1, batch_size=8, lora_rank=2, lr=0.01),
            settings=RunSettings(show_progress=False, seed=0),
            evaluator=evaluator,
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for experience in benchmark.train_stream:
                strategy.train(experience)
        assert relabel == any("relabels its classes" in str(w.message) for w in caught)
        metrics = strategy.eval(benchmark.test_stream)
        accuracies[relabel] = sorted(v for k, v in metrics.items() if k.startswith("Top1_Acc_Exp"))
        if relabel:
            assert strategy.class_names[0] == data.class_names[5]  # class 5 came first: id 0 now
    assert np.allclose(accuracies[False], accuracies[True])
    assert min(accuracies[True]) > 0.3  # learned, not the 1-in-8 of prompts naming the wrong class
