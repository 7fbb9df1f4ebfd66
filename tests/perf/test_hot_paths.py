"""The hot paths under pytest-benchmark, on the CPU with the tiny CLIP.

    pytest tests/perf --benchmark-only --benchmark-autosave      # record a baseline
    pytest tests/perf --benchmark-only --benchmark-compare       # compare with the last one

``--benchmark-compare-fail=mean:20%`` turns a regression of more than 20 % into a failure. A plain
``pytest`` skips this folder (``tests/conftest.py``). Each benchmark also checks what it computed,
so a fast wrong answer does not pass. Ratios between implementations stay in
``python -m benchmarks.tools.speed``.
"""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
from benchmarks.core.atomic_io import read_json
from benchmarks.data.class_orders import seeded_order
from benchmarks.data.datasets import load_dataset
from benchmarks.data.streams import build_stream
from benchmarks.data.transforms import eval_transform
from benchmarks.runner.reading import ResultFile
from benchmarks.runner.result_record import RunResult
from benchmarks.runner.results import Predictions, ResultStore, RunKey
from benchmarks.tools.speed import _stage1_step, _strategy
from strategies.methods.gr4cil import unified_scores
from strategies.registry import get_strategy
from strategies.settings import RunSettings

WIDTH, TASKS, PER_TASK = 512, 10, 10  # ViT-B/16's embedding width; CIFAR-100 in 10 tasks


def test_gr4cil_unified_scores_over_ten_branches(benchmark):
    """Sec. "Routing and Inference": q = s + beta g + gamma <v, p> for each of 10 branches, 256 images."""
    torch.manual_seed(0)
    images = [F.normalize(torch.randn(256, WIDTH), dim=1) for _ in range(TASKS)]
    text = F.normalize(torch.randn(TASKS * PER_TASK, WIDTH), dim=1)
    heads = [F.normalize(torch.randn(WIDTH, PER_TASK), dim=0) for _ in range(TASKS)]
    prototypes = [F.normalize(torch.randn(PER_TASK, WIDTH), dim=1) for _ in range(TASKS)]

    def all_branches():
        return torch.cat(
            [
                unified_scores(
                    images[t], text[t * PER_TASK : (t + 1) * PER_TASK], heads[t], prototypes[t], 0.2, 0.2
                )
                for t in range(TASKS)
            ],
            dim=1,
        )

    scores = benchmark(all_branches)
    assert scores.shape == (256, TASKS * PER_TASK)
    t, c = 7, 3  # one entry by hand
    v = images[t][5]
    expected = v @ text[t * PER_TASK + c] + 0.2 * (v @ heads[t][:, c]) + 0.2 * (v @ prototypes[t][c])
    assert float(scores[5, t * PER_TASK + c]) == pytest.approx(float(expected), abs=1e-5)


def test_text_pass_over_1000_imagenet_prompts(benchmark):
    """The text tower over ImageNet-1K's 1,000 prompts in length buckets, as GR4CIL's stage 1 runs it."""
    strategy = _strategy(TINY_MODEL, 1000, "cpu", "fp32")
    strategy.add_adapter("text", "text")
    backbone = strategy.backbone
    backbone.set_adapters(visual=None, text="text")
    backbone.eval()
    prompts = backbone.prepare_prompts(strategy.prompt_tokens, compact=True)

    with torch.no_grad():
        features = benchmark(backbone.encode_text, prompts)
    assert features.shape == (1000, backbone.embed_dim)
    torch.testing.assert_close(features.norm(dim=1), torch.ones(1000))


def test_one_gr4cil_stage1_step(benchmark):
    """Forward and backward of one stage-1 batch at the last of 10 tasks (CLIP, anchor and separation
    losses)."""
    strategy = _strategy(TINY_MODEL, TASKS * PER_TASK, "cpu", "fp32")
    strategy.setup_task(0, list(range(PER_TASK)))
    strategy.backbone.train()
    strategy.seen_classes = list(range((TASKS - 1) * PER_TASK))
    strategy.current_classes = list(range((TASKS - 1) * PER_TASK, TASKS * PER_TASK))
    strategy.anchors = F.normalize(
        torch.randn(len(strategy.seen_classes), strategy.backbone.embed_dim), dim=1
    )
    size = strategy.backbone.image_size
    images, targets = torch.randn(32, 3, size, size), torch.randint(0, PER_TASK, (32,))

    benchmark(_stage1_step, strategy, images, targets, [0])
    assert torch.isfinite(strategy.loss)
    gradients = [p.grad for p in strategy.backbone.parameters() if p.requires_grad]
    assert gradients and all(g is not None for g in gradients)


def test_one_evaluation_stage_of_a_prompt_method(benchmark):
    """L2P++ scoring a 200-image test set after its first task: the query pass, then the prompted pass."""
    torch.manual_seed(0)
    data = load_dataset("synthetic", n_classes=20, n_train_per_class=4, n_test_per_class=10)
    backbone = create_clip(BackboneSpec(TINY_MODEL, "synthetic"))
    transform = eval_transform(backbone.image_size, backbone.mean, backbone.std)
    stream = build_stream(data, 2, seeded_order(20), transform, transform)
    cls = get_strategy("l2p_pp")
    strategy = cls(
        backbone=backbone,
        class_names=stream.class_names,
        config=cls.Config.from_dict({"epochs": 1, "batch_size": 8, "eval_batch_size": 100}, "l2p_pp"),
        settings=RunSettings(show_progress=False),
    )
    strategy.learn(stream.train_stream[0])

    scores = benchmark(strategy.evaluate_dataset, stream.test_set)
    assert scores.shape == (len(stream.test_set), 10)  # the 10 classes seen so far
    assert torch.isfinite(scores).all()


def test_results_store_writes_a_run(benchmark, tmp_path):
    """One 10-task result JSON and its predictions sidecar (2,000 images x 10 stages), written atomically."""
    rng = np.random.default_rng(0)
    stages = [
        {
            "task": t,
            "acc": 50.0,
            "acc_per_task": [50.0] * t,
            "n_test_per_task": [200] * t,
            "routing_acc": 60.0,
            "auroc": 70.0,
            "fpr95": 80.0,
            "diagnostics": {},
        }
        for t in range(1, 11)
    ]
    result = {
        "schema_version": 2,
        "strategy": "gr4cil",
        "label": "gr4cil",
        "dataset": "synthetic",
        "n_tasks": 10,
        "seed": 0,
        "config": {"backbone": {"model": TINY_MODEL}},
        "config_hash": "0" * 16,
        "class_order": list(range(100)),
        "class_names": [f"c{i}" for i in range(100)],
        "tasks": [list(range(10 * t, 10 * t + 10)) for t in range(10)],
        "stages": stages,
        "summary": {"avg_acc": 50.0, "last_acc": 50.0},
        "diagnostics": {},
        "env": {},
        "cost": {"train_seconds": 0.0, "eval_seconds": 0.0, "peak_memory_bytes": 0},
    }
    targets = np.repeat(np.arange(100), 20)
    predictions = Predictions(rng.integers(0, 100, size=(10, 2000)), targets, np.arange(2000))
    store, key = ResultStore(tmp_path), RunKey("gr4cil", "synthetic", 10, 0)

    benchmark(store.save, key, dict(result), predictions)  # returns the record as stored
    path = store.result_path(key)
    stored = read_json(path)
    assert {k: v for k, v in stored.items() if k != "predictions"} == json.loads(json.dumps(result))
    loaded = ResultFile(path, RunResult.from_json(stored)).load_predictions()
    np.testing.assert_array_equal(loaded.predictions, predictions.predictions)
