"""The base strategy's training options: optimiser choice, warm-up and cosine schedules (per
iteration or per epoch), gradient clipping, the epoch-end callback that can stop training, the
training loader's workers, and text encoded once per evaluation. The schedules' own numbers are
in ``test_optim.py``, the options' validation in ``test_config.py``."""

import math

import pytest
import torch
from avalanche.training.plugins import SupervisedPlugin

from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
from benchmarks.core.precision import resolve_precision
from benchmarks.data.class_orders import seeded_order
from benchmarks.data.datasets import load_dataset
from benchmarks.data.streams import build_stream
from benchmarks.data.transforms import eval_transform
from benchmarks.tools.loader_speed import LoaderProbe, loader_workers
from strategies.config import StrategyConfig
from strategies.methods.finetune import Finetune
from strategies.optim import warmup_cosine_factor
from strategies.registry import get_strategy
from strategies.settings import RunSettings
from tests.helpers import tiny_strategy

LR = 0.01
ITERATIONS_PER_EPOCH = 3  # 6 classes x 8 images, batch 16


class Record(SupervisedPlugin):
    """The learning rate of every iteration, the gradient norm after every update, the epochs run."""

    def __init__(self):
        super().__init__()
        self.lrs, self.grad_norms, self.epochs = [], [], 0

    def before_training_iteration(self, strategy, **kwargs):
        self.lrs.append(strategy.optimizer.param_groups[0]["lr"])

    def after_update(self, strategy, **kwargs):
        grads = [p.grad for p in strategy.optimized_tensors if p.grad is not None]
        self.grad_norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))

    def after_training_epoch(self, strategy, **kwargs):
        self.epochs += 1


@pytest.fixture(scope="module")
def first_task():
    data = load_dataset("synthetic", n_classes=12, n_train_per_class=8, n_test_per_class=1)
    stream = build_stream(data, 2, seeded_order(12), eval_transform(32), eval_transform(32))
    return stream.class_names, stream.train_stream[0]


def _train(first_task, strategy_cls=Finetune, **options) -> tuple[Finetune, Record]:
    class_names, experience = first_task
    config = StrategyConfig.from_dict({"epochs": 3, "batch_size": 16, "lora_rank": 2, "lr": LR, **options})
    record = Record()
    strategy = strategy_cls(
        backbone=create_clip(BackboneSpec(TINY_MODEL, "synthetic")),
        class_names=class_names,
        config=config,
        settings=RunSettings(show_progress=False),
        plugins=[record],
    )
    torch.manual_seed(0)
    strategy.train(experience)
    return strategy, record


def test_default_schedule_is_a_cosine_per_iteration(first_task):
    strategy, record = _train(first_task)
    total = 3 * ITERATIONS_PER_EPOCH
    assert isinstance(strategy.optimizer, torch.optim.AdamW)
    assert record.lrs == pytest.approx([LR * 0.5 * (1 + math.cos(math.pi * i / total)) for i in range(total)])


def test_warmup_and_floor_per_iteration(first_task):
    _, record = _train(first_task, warmup_steps=2, min_lr_ratio=0.1)
    total = 3 * ITERATIONS_PER_EPOCH
    assert record.lrs == pytest.approx([LR * warmup_cosine_factor(i, total, 2, 0.1) for i in range(total)])
    # CLAP's form: int(0.25 * 9) = 2 steps at (k + 1) / 3, then the same cosine
    _, by_fraction = _train(first_task, warmup_fraction=0.25, min_lr_ratio=0.1)
    assert by_fraction.lrs == pytest.approx([LR / 3, 2 * LR / 3, *record.lrs[2:]])


def test_cosine_per_epoch_holds_within_an_epoch(first_task):
    _, record = _train(first_task, schedule="cosine_epoch", optimizer="sgd", momentum=0.9)
    per_epoch = [LR * 0.5 * (1 + math.cos(math.pi * e / 3)) for e in range(3)]
    assert record.lrs == pytest.approx([lr for lr in per_epoch for _ in range(ITERATIONS_PER_EPOCH)])


@pytest.mark.parametrize(("name", "kind"), [("sgd", torch.optim.SGD), ("adam", torch.optim.Adam)])
def test_optimizer_choice(first_task, name, kind):
    strategy, _ = _train(first_task, optimizer=name, momentum=0.9 if name == "sgd" else 0.0, epochs=1)
    assert type(strategy.optimizer) is kind
    assert strategy.optimizer.param_groups[0].get("momentum", 0.9) == 0.9


def test_gradient_clipping_bounds_the_update_norm(first_task):
    _, unclipped = _train(first_task, epochs=1)
    clip = 0.5 * min(unclipped.grad_norms)
    _, clipped = _train(first_task, epochs=1, grad_clip=clip)
    assert max(unclipped.grad_norms) > clip  # the negative control: clipping has work to do
    assert max(clipped.grad_norms) <= clip * (1 + 1e-5)


class StopAfterOneEpoch(Finetune):
    def on_epoch_end(self, epoch, loss):
        assert math.isfinite(loss)
        return epoch == 0


def test_epoch_end_callback_stops_training(first_task):
    strategy, record = _train(first_task, strategy_cls=StopAfterOneEpoch)
    assert record.epochs == 1 and len(record.lrs) == ITERATIONS_PER_EPOCH
    assert strategy.seen_classes  # the task still finished (prototypes, caches, bookkeeping)


class StructuredOutput(Finetune):
    """A strategy whose training output is a dict: the base must pass it through untouched."""

    seen_outputs: list = []

    def compute_logits(self, images):
        return {"logits": super().compute_logits(images), "batch": len(images)}

    def compute_loss(self, output, local_targets):
        assert set(output) == {"logits", "batch"} and output["batch"] == len(local_targets)
        self.seen_outputs.append(output["batch"])
        return super().compute_loss(output["logits"], local_targets)


def test_avalanche_builds_the_training_loader_with_the_configured_workers(tiny_stream):
    probe = LoaderProbe()
    torch.manual_seed(0)
    strategy = Finetune(
        backbone=create_clip(BackboneSpec(TINY_MODEL, "synthetic")),
        class_names=tiny_stream.class_names,
        plugins=[probe],
        config=Finetune.Config(epochs=2, batch_size=16, num_workers=2, lora_rank=4, lora_alpha=4.0),
        settings=RunSettings(show_progress=False),
    )
    strategy.learn(tiny_stream.train_stream[0])  # Avalanche's own train(): no loader arguments passed
    assert loader_workers(probe.loader) == 2 and probe.loader.persistent_workers
    assert not probe.loader.pin_memory  # pinned only on CUDA
    assert strategy.loader_options() == {"num_workers": 2, "persistent_workers": True, "pin_memory": False}


def test_evaluation_encodes_the_text_once_per_call(tiny_stream, monkeypatch):
    strategy = tiny_strategy(Finetune, tiny_stream, eval_batch_size=4)  # 60 test images: 15 batches
    strategy.learn(tiny_stream.train_stream[0])
    calls = []
    real_encode = type(strategy.backbone).encode_text
    monkeypatch.setattr(
        type(strategy.backbone),
        "encode_text",
        lambda self, *a, **k: calls.append(1) or real_encode(self, *a, **k),
    )
    scores = strategy.evaluate_dataset(tiny_stream.test_set)
    assert len(calls) == 1 and scores.shape == (60, 10)
    with torch.no_grad():
        per_batch = torch.cat(
            [
                strategy.scores(torch.stack([tiny_stream.test_set[i][0] for i in range(j, j + 4)]))
                for j in range(0, 8, 4)
            ]
        )
    torch.testing.assert_close(scores[:8], per_batch, atol=0, rtol=0)
    assert len(calls) == 3  # outside an evaluation pass the text is encoded per call, as it may be training


def test_compute_logits_may_return_any_object(first_task):
    strategy, record = _train(first_task, strategy_cls=StructuredOutput, epochs=1)
    assert StructuredOutput.seen_outputs == [16, 16, 16] and len(record.lrs) == ITERATIONS_PER_EPOCH


class OpaqueOutput(Finetune):
    """A training output with no logits to lay out by class id: it trains, and says so once."""

    def compute_logits(self, images):
        return (super().compute_logits(images),)

    def compute_loss(self, output, local_targets):
        return super().compute_loss(output[0], local_targets)


def test_an_output_without_logits_trains_and_warns_once_that_metrics_get_it_as_it_is(first_task):
    with pytest.warns(RuntimeWarning, match="not logits over the current classes") as caught:
        _train(first_task, strategy_cls=OpaqueOutput, epochs=1)
    assert sum("training_class_logits" in str(w.message) for w in caught) == 1


class WithHead(Finetune):
    """Finetune plus learned non-LoRA state of three kinds, checkpointed by the generic path."""

    checkpoint_attributes = ("head", "per_task", "missing")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.head, self.per_task, self.missing = torch.nn.Linear(4, 2), [], None

    def finish_task(self, task, classes):
        self.per_task.append(torch.full((len(classes),), float(task)))


def test_checkpoint_attributes_are_saved_as_state_keys_and_restored(first_task, tmp_path):
    strategy, _ = _train(first_task, strategy_cls=WithHead, epochs=1)
    tensors, meta = strategy.checkpoint_state()
    assert {"state/head/weight", "state/head/bias", "state/per_task/0"} <= set(tensors)
    assert meta["state_kinds"] == {"head": "module", "per_task": "list", "missing": "none"}
    strategy.save_model(tmp_path / "m")
    class_names, _ = first_task
    fresh = WithHead(
        backbone=create_clip(BackboneSpec(TINY_MODEL, "synthetic")),
        class_names=class_names,
        config=strategy.cfg,
        settings=RunSettings(show_progress=False),
    )
    fresh.load_model(tmp_path / "m")
    assert torch.equal(fresh.head.weight, strategy.head.weight) and fresh.missing is None
    assert len(fresh.per_task) == 1 and torch.equal(fresh.per_task[0], strategy.per_task[0])


def test_amp_false_keeps_auto_precision_fp32_and_an_explicit_precision_wins():
    assert (
        resolve_precision("auto", "cuda") == "fp16" and resolve_precision("auto", "cuda", amp=False) == "fp32"
    )
    assert (
        resolve_precision("fp16", "cuda", amp=False) == "fp16" and resolve_precision("auto", "cpu") == "fp32"
    )
    for name in ("mg_clip", "magmax", "moe4cl"):
        assert get_strategy(name).Config().amp is False  # fp32 in their official code
    assert get_strategy("gr4cil").Config().amp is True
