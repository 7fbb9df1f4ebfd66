"""The ``mammoth:`` adapter meets each habit of Mammoth's models with no edit to the model
(``tests/strategies/mammoth_shaped/``, a stand-in checkout written in Mammoth's shape): an import
that moves the working directory and ``sys.path`` and downloads, ``args`` from Mammoth's parser and
the suite, the ``meta_*`` wrappers and their task counters, one-line errors, ``--quiet``, and
resumes that keep the numbers (or start over and say why)."""

import logging
import os
import sys
import time
from pathlib import Path

import pytest
import torch

from benchmarks.core.environment import seed_everything
from benchmarks.core.errors import UserError
from strategies.settings import RunSettings

SHAPED = Path(__file__).parent / "mammoth_shaped"
REPLAY = "mammoth:models.replay:Replay"
DISTILL = "mammoth:models.distill:Distill"
ORDER = [7, 3, 11, 0, 5, 9, 1, 2, 10, 4, 8, 6]
_TOP = ("models", "datasets", "utils")


def _forget_the_checkout():
    from strategies import registry

    for name in [m for m in sys.modules if m.partition(".")[0] in _TOP]:
        del sys.modules[name]
    for name in [n for n in registry._ADAPTED if n.startswith("mammoth:models.")]:
        del registry._ADAPTED[name]


@pytest.fixture(autouse=True)
def _shaped_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(SHAPED))
    yield
    _forget_the_checkout()  # its top-level names are Mammoth's; leave none for other tests


def built(name, stream, show_progress=False, **options):
    from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
    from strategies.registry import get_strategy

    cls = get_strategy(name)
    torch.manual_seed(0)
    return cls(
        backbone=create_clip(BackboneSpec(TINY_MODEL, "synthetic")),
        class_names=stream.class_names,
        config=cls.Config.from_dict({"batch_size": 8, "head": "cosine", "lr": 1e-3, **options}, name),
        settings=RunSettings(show_progress=show_progress, seed=0),
    )


def learn(strategy, stream, tasks):
    for task in tasks:
        seed_everything(0, task)  # as the runner seeds every task: torch, numpy, random
        strategy.learn(stream.train_stream[task])


def test_the_import_keeps_the_directory_and_path_and_leaves_out_a_downloading_module(capsys):
    from strategies.registry import get_strategy

    cwd, path = os.getcwd(), list(sys.path)
    start = time.perf_counter()
    get_strategy(REPLAY)
    assert time.perf_counter() - start < 30  # refused at once, no network timeout
    assert (os.getcwd(), sys.path) == (cwd, path)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"note: importing {REPLAY} skipped module datasets.seq_fetches"
    )
    assert "downloads from weights.example.org" in lines[0] and "the run is unaffected unless" in lines[0]
    assert "error" not in lines[0] and "refused" not in lines[0]  # worded as the harmless note it is
    fetches = sys.modules["datasets.seq_fetches"]
    assert not hasattr(fetches, "SequentialFetches")
    with pytest.raises(UserError, match="left out") as refused:
        fetches.SequentialFetches
    assert "\n" not in str(refused.value)
    assert sys.modules["datasets.seq_plain"].SequentialPlain.N_TASKS == 3  # the rest imported


def test_a_model_module_that_downloads_is_refused_in_one_line():
    from strategies.registry import get_strategy

    cwd = os.getcwd()
    with pytest.raises(UserError) as refused:
        get_strategy("mammoth:models.fetches:Fetches")
    message = str(refused.value)
    assert "module models.fetches tried to download from config.example.org" in message
    assert "\n" not in message and os.getcwd() == cwd


def test_args_come_from_mammoths_parser_and_the_suite(stream):
    strategy = built(REPLAY, stream, args={"buffer_size": 10})
    args = strategy.args
    assert (args.buffer_size, args.lr, args.batch_size, args.n_epochs) == (10, 1e-3, 8, 1)
    assert args.minibatch_size == 8  # Mammoth's rule: a given batch size sets it
    assert (args.optimizer, args.optim_wd) == ("adamw", 0.1)  # the suite's fields, in Mammoth's names
    assert (args.label_perc, args.scheduler_mode, args.nowand) == (1, "epoch", 1)  # Mammoth's defaults
    assert built(REPLAY, stream, args={"buffer_size": 10, "minibatch_size": 3}).args.minibatch_size == 3


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({}, "requires buffer_size and gives no default"),
        (
            {"args": {"buffer_size": 5, "minibach_size": 3}},
            "'minibach_size' (did you mean 'minibatch_size'?)",
        ),
        ({"args": {"buffer_size": 5, "lr": 0.1}}, "lr (the suite's lr)"),
        ({"args": {"buffer_size": 5, "optimizer": "sgd"}}, "optimizer (the suite's optimizer)"),
        ({"args": {"buffer_size": 5, "scheduler_mode": "never"}}, "scheduler_mode = 'never' is not one of"),
        (
            {"args": {"buffer_size": 5, "label_perc": 0.5}},
            "args {'label_perc': 0.5} change what the runner fixes",
        ),
    ],
)
def test_wrong_args_are_one_line_before_any_run(options, says):
    from strategies.registry import get_strategy

    cls = get_strategy(REPLAY)
    with pytest.raises(UserError) as refused:
        cls.Config.from_dict(options, REPLAY)
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_the_meta_wrappers_keep_the_counters_the_model_reads(stream, test_images):
    strategy = built(DISTILL, stream)
    seen_optimisers = []
    for task in range(3):
        learn(strategy, stream, [task])
        model = strategy.model
        seen_optimisers.append(model.opt)
        assert model.current_task == task + 1
        assert (model.n_past_classes, model.n_seen_classes) == (4 * task, 4 * task + 4)
        fields = strategy.data.train_loader.dataset.extra_return_fields
        assert fields == (("logits",) if task else ())  # the old logits reach observe from task 2
    assert len({id(opt) for opt in seen_optimisers}) == 3  # meta_begin_task built each task's
    assert strategy.train_iterations == 9  # 3 batches of 8 a task
    images, labels = test_images
    scores = strategy.scores(images)
    assert scores.shape == (len(images), 12) and strategy.seen_classes == ORDER
    # column k is the class at position k (the class order), whatever its id
    learned = torch.tensor(ORDER)[scores.argmax(dim=1)]
    assert (learned == labels).float().mean() > 0.3


def test_labels_are_class_positions_in_the_class_order(stream):
    strategy = built(REPLAY, stream, args={"buffer_size": 30})
    learn(strategy, stream, [0, 1])
    items = strategy.data.train_loader.dataset
    experience = stream.train_stream[1].dataset
    assert [int(t) for t in items.targets] == [ORDER.index(int(c)) for c in experience.targets]
    assert set(items.targets.tolist()) == {4, 5, 6, 7}
    assert strategy.net.classifier.order.tolist() == ORDER
    labels = strategy.model.buffer.labels[: len(strategy.model.buffer)]
    assert set(labels.tolist()) <= set(range(8)) and len(strategy.model.buffer) == 30


@pytest.mark.parametrize("name", [REPLAY, DISTILL])
def test_a_resumed_model_learns_the_next_task_bit_for_bit(name, stream, test_images):
    images, _ = test_images
    options = {"args": {"buffer_size": 20}} if name == REPLAY else {}
    strategy = built(name, stream, **options)
    learn(strategy, stream, [0, 1])
    tensors, meta = strategy.checkpoint_state()
    assert strategy.resume_refusal(meta) is None
    restored = built(name, stream, **options)
    restored.load_checkpoint_state(tensors, meta)
    assert torch.equal(restored.scores(images), strategy.scores(images))
    assert restored.model.current_task == 2
    learn(strategy, stream, [2])
    learn(restored, stream, [2])
    assert torch.equal(restored.scores(images), strategy.scores(images))
    if name == REPLAY:
        assert torch.equal(restored.model.buffer.examples, strategy.model.buffer.examples)
        assert (
            restored.model.buffer.num_seen_examples == strategy.model.buffer.num_seen_examples == 72
        )  # 12 classes x 6


def test_the_checkpoint_holds_the_buffer_and_leaves_out_the_backbone(stream):
    strategy = built(REPLAY, stream, args={"buffer_size": 20})
    learn(strategy, stream, [0])
    tensors, meta = strategy.checkpoint_state()
    state = meta["mammoth"]
    assert tensors["mammoth/attr/buffer.labels"].tolist() == strategy.model.buffer.labels.tolist()
    assert state["attributes"]["buffer.num_seen_examples"] == {"kind": "json", "value": 24}  # 4 classes x 6
    assert state["attributes"]["_current_task"] == {"kind": "json", "value": 1}
    assert not [k for k in tensors if ".backbone." in k]  # the frozen CLIP is rebuilt, not saved
    assert state["unsaved"] == []


def test_state_a_checkpoint_cannot_hold_makes_the_run_start_over(stream):
    strategy = built("mammoth:models.keeps_callable:KeepsCallable", stream)
    learn(strategy, stream, [0])
    _, meta = strategy.checkpoint_state()
    assert strategy.resume_refusal(meta) == "its model keeps mask (function), which a checkpoint cannot hold"


def test_an_exception_in_the_models_code_is_one_line_naming_its_file(stream):
    strategy = built("mammoth:models.broken:Broken", stream)
    with pytest.raises(UserError) as refused:
        learn(strategy, stream, [0])
    message = str(refused.value)
    assert "\n" not in message and "IndexError" in message
    source = (SHAPED / "models" / "broken.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if '["logits"]' in text)
    assert f"models/broken.py:{line} (observe) while training task 1" in message
    assert "args lr=0.001, n_epochs=1, batch_size=8" in message


@pytest.mark.parametrize("show_progress", [True, False])
def test_quiet_silences_the_models_logging(stream, caplog, show_progress):
    strategy = built(REPLAY, stream, show_progress=show_progress, args={"buffer_size": 5})
    with caplog.at_level(logging.WARNING):
        learn(strategy, stream, [0])
    assert ("task 0 begins" in caplog.text) == show_progress


@pytest.mark.parametrize("show_progress", [True, False])
def test_quiet_silences_the_models_progress_bars(stream, capsys, show_progress):
    strategy = built("mammoth:models.with_bar:WithBar", stream, show_progress=show_progress)
    capsys.readouterr()
    learn(strategy, stream, [0])
    assert ("counting items" in capsys.readouterr().err) == show_progress


@pytest.mark.slow
def test_a_run_killed_in_task_2_resumes_bit_identically(tmp_path, monkeypatch):
    from strategies.registry import get_strategy
    from tests.helpers import killed_and_resumed, run_one_run_suite, three_task_suite

    options = 'head = "cosine"\nbatch_size = 8\nargs = { buffer_size = 20 }'
    suite, _, reference = run_one_run_suite(tmp_path, three_task_suite(REPLAY, options))
    resumed = killed_and_resumed(monkeypatch, get_strategy(REPLAY), suite, tmp_path / "resumed", task=2)
    assert resumed["stages"] == reference["stages"]
