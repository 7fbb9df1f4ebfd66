"""Every registered strategy is an Avalanche strategy: built with Avalanche's plugins, evaluator,
metrics and logger, trained with ``strategy.train`` task by task, evaluated with ``strategy.eval``,
and Avalanche's accuracy is the runner's (scores over all seen classes, no task id). Avalanche's
training accuracy (``accuracy_metrics(minibatch=True, epoch=True)``) equals one computed by hand
from each step's own output, over class ids."""

from pathlib import Path

import numpy as np
import pytest
from avalanche.evaluation.metrics import accuracy_metrics, loss_metrics
from avalanche.logging import InteractiveLogger
from avalanche.training.plugins import EvaluationPlugin, SupervisedPlugin

from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
from benchmarks.core.metrics import stage_metrics
from benchmarks.data.class_orders import seeded_order
from benchmarks.data.datasets import load_dataset
from benchmarks.data.streams import build_stream
from benchmarks.data.transforms import eval_transform, train_transform
from strategies.registry import available, get_strategy
from strategies.settings import RunSettings

N_TASKS = 3
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "my_strategy"  # docs/adding-a-strategy.md


class TrainingHits(SupervisedPlugin):
    """Each training step's hits, by hand from ``compute_logits``'s own output: its logits' argmax,
    read as a class id through the columns the strategy's training logits cover."""

    def __init__(self):
        super().__init__()
        self.hits, self.seen, self.last_batch = 0, 0, 0.0

    def before_training_exp(self, strategy, **kwargs):
        self.hits, self.seen = 0, 0

    def after_forward(self, strategy, **kwargs):
        if not strategy.is_training:
            return
        out = strategy.train_output
        if hasattr(out, "clip_logits"):  # AdapterVLM: its CLIP logits over the task's classes
            logits, columns = out.clip_logits, strategy.current_classes
        elif hasattr(out, "kl"):  # CLAP: R samples of logits over the seen, then the current classes
            logits = out.logits.reshape(strategy.cfg.samples, len(strategy.mb_y), -1).mean(0)
            columns = strategy.seen_classes + strategy.current_classes
        else:
            logits = out if hasattr(out, "argmax") else out.logits
            columns = strategy.current_classes
        predicted = [columns[i] for i in logits.argmax(dim=1).tolist()]
        hits = sum(p == y for p, y in zip(predicted, strategy.mb_y.tolist(), strict=True))
        self.hits += hits
        self.seen += len(predicted)
        self.last_batch = hits / len(predicted)


class CountCalls(SupervisedPlugin):
    """A user's plugin: counts the training and evaluation experiences it sees."""

    def __init__(self):
        super().__init__()
        self.trained, self.evaluated = 0, 0

    def after_training_exp(self, strategy, **kwargs):
        self.trained += 1

    def after_eval_exp(self, strategy, **kwargs):
        self.evaluated += 1


@pytest.fixture(scope="module")
def stream():
    data = load_dataset("synthetic", n_classes=12, n_train_per_class=6, n_test_per_class=4, domain="faded")
    return build_stream(data, N_TASKS, seeded_order(12), train_transform(32), eval_transform(32))


# The tiny model has 4 visual blocks and 64-d queries: prompt blocks and components that fit it.
TINY_MODEL_OPTIONS = {
    "dualprompt": {"e_layers": [2, 3]},
    "coda_prompt": {"prompt_layers": [0, 1, 2, 3], "components": 12},
}


def _stream_accuracy(metrics: dict) -> float:
    (value,) = [v for k, v in metrics.items() if k.startswith("Top1_Acc_Stream/eval_phase/test_stream")]
    return 100.0 * value


@pytest.mark.slow
@pytest.mark.parametrize("name", [*available(), "my_strategy.strategy:MyStrategy"])
def test_avalanche_train_and_eval_match_the_runner(name, stream, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))  # the example from outside the repository, installed nowhere
    cls = get_strategy(name)
    config = cls.Config.from_dict(
        {
            "epochs": 0 if name == "continual_clip" else 1,
            "batch_size": 16,
            "eval_batch_size": 7,
            "lora_rank": 2,
            "lr": 0.01,
            "num_workers": 0,
            **TINY_MODEL_OPTIONS.get(name, {}),
        },
        name,
    )
    if hasattr(config, "compensation_epochs"):
        config.compensation_epochs = 1
    plugin, hits = CountCalls(), TrainingHits()
    evaluator = EvaluationPlugin(
        accuracy_metrics(minibatch=True, epoch=True, experience=True, stream=True),
        loss_metrics(stream=True),
        loggers=[InteractiveLogger()],
    )
    strategy = cls(
        backbone=create_clip(BackboneSpec(TINY_MODEL, "synthetic")),
        class_names=stream.class_names,
        config=config,
        settings=RunSettings(show_progress=False),
        plugins=[plugin, hits],
        evaluator=evaluator,
    )
    targets = np.asarray(stream.test_targets)
    test_stream = stream.benchmark.test_stream
    for task, experience in enumerate(stream.train_stream):
        strategy.train(experience)
        if strategy.train_epochs:  # continual_clip trains nothing
            last = evaluator.get_last_metrics()
            (epoch,) = [v for k, v in last.items() if k.startswith("Top1_Acc_Epoch/train_phase")]
            (batch,) = [v for k, v in last.items() if k.startswith("Top1_Acc_MB/train_phase")]
            assert epoch == pytest.approx(hits.hits / hits.seen, abs=1e-12), task
            assert batch == pytest.approx(hits.last_batch, abs=1e-12), task
        adapters = dict(strategy.adapters)
        metrics = strategy.eval(test_stream[: task + 1])
        assert strategy.adapters == adapters  # evaluation added or changed nothing

        runner = stage_metrics(
            strategy.evaluate_dataset(stream.test_set).numpy(),
            strategy.seen_classes,
            targets,
            stream.task_of_class,
            task + 1,
        )
        assert _stream_accuracy(metrics) == pytest.approx(runner["acc"], abs=1e-9), (task, metrics)
        per_task = [
            v for k, v in sorted(metrics.items()) if k.startswith("Top1_Acc_Exp/eval_phase/test_stream")
        ]
        assert [100.0 * v for v in per_task] == pytest.approx(runner["acc_per_task"], abs=1e-9)
        assert np.isfinite([v for k, v in metrics.items() if k.startswith("Loss_Stream")]).all()

    assert strategy.task_classes == [sorted(t) for t in stream.tasks]
    assert (plugin.trained, plugin.evaluated) == (N_TASKS, N_TASKS * (N_TASKS + 1) // 2)
    assert "Top1_Acc_Stream/eval_phase/test_stream" in capsys.readouterr().out  # the logger printed it
