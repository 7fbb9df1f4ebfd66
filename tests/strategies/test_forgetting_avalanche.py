"""Backward transfer is minus Avalanche's stream forgetting on the same run: a registered strategy
trained and evaluated with Avalanche's own loop and ``forgetting_metrics(stream=True)``, beside the
suite's per-task accuracies of the same model after each task."""

import numpy as np
import pytest
from avalanche.evaluation.metrics import accuracy_metrics, forgetting_metrics
from avalanche.training.plugins import EvaluationPlugin

from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
from benchmarks.core.metrics import stage_metrics, summarize
from benchmarks.data.class_orders import seeded_order
from benchmarks.data.datasets import load_dataset
from benchmarks.data.streams import build_stream
from benchmarks.data.transforms import eval_transform, train_transform
from strategies.registry import get_strategy
from strategies.settings import RunSettings

N_TASKS = 3
STREAM_FORGETTING = "StreamForgetting/eval_phase/test_stream"


@pytest.mark.slow
def test_backward_transfer_is_minus_avalanches_stream_forgetting():
    data = load_dataset("synthetic", n_classes=12, n_train_per_class=6, n_test_per_class=4, domain="faded")
    stream = build_stream(data, N_TASKS, seeded_order(12), train_transform(32), eval_transform(32))
    cls = get_strategy("finetune")
    # a large step, so that later tasks visibly move the earlier ones' accuracies
    config = cls.Config.from_dict(
        {"epochs": 1, "batch_size": 8, "eval_batch_size": 16, "lora_rank": 2, "lr": 0.05, "num_workers": 0},
        "finetune",
    )
    strategy = cls(
        backbone=create_clip(BackboneSpec(TINY_MODEL, "synthetic")),
        class_names=stream.class_names,
        config=config,
        settings=RunSettings(show_progress=False),
        evaluator=EvaluationPlugin(
            forgetting_metrics(stream=True), accuracy_metrics(experience=True), loggers=[]
        ),
    )
    targets = np.asarray(stream.test_targets)
    stages, metrics = [], {}
    for task, experience in enumerate(stream.train_stream):
        strategy.train(experience)
        metrics = strategy.eval(stream.benchmark.test_stream[: task + 1])
        scores = strategy.evaluate_dataset(stream.test_set).numpy()
        stages.append(stage_metrics(scores, strategy.seen_classes, targets, stream.task_of_class, task + 1))
    summary = summarize(stages)
    assert summary["bwt"] != 0.0  # the tasks did interfere: the equality below is not 0 == 0
    # Avalanche's accuracies are fractions, the suite's percent
    assert summary["bwt"] == pytest.approx(-100.0 * metrics[STREAM_FORGETTING], abs=1e-9)
