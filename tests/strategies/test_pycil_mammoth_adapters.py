"""The PyCIL and Mammoth adapters (``strategies.frameworks.pycil`` / ``mammoth``) with their examples
(``examples/pycil_ncm``, ``examples/mammoth_er``) on a 3-task synthetic stream and the tiny CLIP."""

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.core.errors import UserError
from strategies.settings import RunSettings

REPO = Path(__file__).resolve().parents[2]
NCM = "pycil:pycil_ncm.learner:NCM"
ER = "mammoth:mammoth_er.model:ER"
# three tasks of four classes; task 2 is classes {5, 9, 1, 2}, learned as positions 4..7 in id order
ORDER = [7, 3, 11, 0, 5, 9, 1, 2, 10, 4, 8, 6]


@pytest.fixture(autouse=True)
def _examples_on_path(monkeypatch):
    for example in ("pycil_ncm", "mammoth_er"):
        monkeypatch.syspath_prepend(str(REPO / "examples" / example))  # installed nowhere


def fresh(name, stream, class_names=None):
    from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
    from strategies.registry import get_strategy

    cls = get_strategy(name)
    torch.manual_seed(0)
    return cls(
        backbone=create_clip(BackboneSpec(TINY_MODEL, "synthetic")),
        class_names=class_names or stream.class_names,
        config=cls.Config(batch_size=8),
        settings=RunSettings(show_progress=False, seed=0),
    )


def learn(strategy, stream, tasks):
    for task in tasks:
        torch.manual_seed(task)  # as the runner seeds every task
        strategy.learn(stream.train_stream[task])


@pytest.mark.parametrize("name", [NCM, ER])
def test_scores_have_one_column_per_seen_class_in_order(name, stream, test_images):
    strategy = fresh(name, stream)
    images, labels = test_images
    for task in range(3):
        learn(strategy, stream, [task])
        expected = [c for t in range(task + 1) for c in stream.tasks[t]]  # the class order
        assert strategy.seen_classes == expected
        scores = strategy.scores(images)
        assert scores.shape == (len(images), len(expected)) and scores.dtype == torch.float32
        seen = torch.isin(labels, torch.tensor(expected))
        predicted = torch.tensor(strategy.seen_classes)[scores.argmax(dim=1)]
        # column k is class seen_classes[k]: most seen test images land on their own class
        assert (predicted[seen] == labels[seen]).float().mean() > 0.6


def test_pycil_labels_are_positions_in_the_learned_order(stream):
    strategy = fresh(NCM, stream)
    learn(strategy, stream, [0, 1])
    manager = strategy.data_manager
    assert manager.class_order == ORDER[:8] and manager.get_task_size(1) == 4
    assert (manager.nb_tasks, manager.get_total_classnum()) == (3, 12)
    assert strategy.learner.args["class_names"] == [stream.class_names[c] for c in manager.class_order]
    experience = stream.train_stream[1].dataset.eval()
    of_class_9 = [experience[i][0] for i, c in enumerate(experience.targets) if c == 9]
    # by hand: class 9 is the second of task 2's classes [5, 9, 1, 2] in ORDER, so position 4 + 1 = 5
    dataset = manager.get_dataset(np.array([5]), source="train", mode="test")
    assert len(dataset) == len(of_class_9) == 6
    for k, (index, image, label) in enumerate(dataset):
        assert (index, label) == (k, 5) and torch.equal(image, of_class_9[k])
    everything = manager.get_dataset(np.arange(4, 8), source="train", mode="train")
    targets = list(experience.targets)
    assert [label for _, _, label in everything] == [manager.class_order.index(c) for c in targets]
    _, flipped, _ = manager.get_dataset(np.array([5]), source="train", mode="flip")[0]
    assert torch.equal(flipped, of_class_9[0].flip(-1))


@pytest.mark.parametrize(
    ("indices", "options", "says"),
    [
        (np.arange(0, 8), {}, "positions [0, 1, 2, 3] outside the current task (4..7)"),
        (np.arange(4, 10), {"source": "test"}, "unseen class positions [8, 9]"),
        (np.arange(4, 8), {"source": "valid"}, "give 'train' or 'test'"),
        (np.arange(4, 8), {"mode": "eval"}, "give 'train', 'test' or 'flip'"),
        (np.arange(4, 8), {"m_rate": 0.5}, "RMM's sampling"),
    ],
)
def test_the_data_manager_refuses_in_one_line(stream, indices, options, says):
    strategy = fresh(NCM, stream)
    learn(strategy, stream, [0, 1])
    arguments = {"source": "train", "mode": "train", **options}
    with pytest.raises(UserError) as refused:
        strategy.data_manager.get_dataset(indices, **arguments)
    assert says in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("name", [NCM, ER])
def test_class_ids_outside_class_names_are_one_line(name, stream):
    strategy = fresh(name, stream, class_names=stream.class_names[:8])
    with pytest.raises(UserError, match=r"class ids \[11\] outside the 8 classes") as refused:
        strategy.learn(stream.train_stream[0])
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("name", [NCM, ER])
def test_a_checkpoint_restores_the_scores_and_the_rest_of_the_stream(name, stream, test_images):
    images, _ = test_images
    strategy = fresh(name, stream)
    learn(strategy, stream, [0, 1])
    tensors, meta = strategy.checkpoint_state()
    restored = fresh(name, stream)
    restored.load_checkpoint_state(tensors, meta)
    assert restored.seen_classes == strategy.seen_classes
    assert torch.equal(restored.scores(images), strategy.scores(images))
    learn(strategy, stream, [2])
    learn(restored, stream, [2])  # a resumed run learns the last task alike
    assert torch.equal(restored.scores(images), strategy.scores(images))


def test_the_pycil_checkpoint_leaves_out_the_untouched_backbone(stream):
    strategy = fresh(NCM, stream)
    learn(strategy, stream, [0])
    tensors, meta = strategy.checkpoint_state()
    assert [k for k in tensors if k.startswith("network/")] == ["network/class_means"]
    assert meta["learner"]["total_classes"] == 4 and meta["learner"]["unsaved"] == []
    counters = {k: v["kind"]["value"] for k, v in meta["learner"]["attributes"].items() if k != "args"}
    assert counters == {"_cur_task": 0, "_known_classes": 4, "_total_classes": 4}
    assert all(key.startswith("backbone.") for key in meta["network_untouched"])


def test_the_er_buffer_is_checkpointed(stream):
    strategy = fresh(ER, stream)
    learn(strategy, stream, [0, 1])
    tensors, meta = strategy.checkpoint_state()
    assert tensors["state/model.buffer_labels"].tolist() == strategy.model.buffer_labels.tolist()
    assert len(tensors["state/model.buffer_images"]) == 48  # 2 tasks x 4 classes x 6 images < 200
    assert meta["attributes"]["model.examples_seen"] == {"kind": "json", "value": 48}
    assert strategy.train_iterations == 6  # 3 batches of 8 a task, 1 epoch


def test_get_strategy_resolves_the_examples_in_their_adapters():
    from mammoth_er.model import ER as ERModel
    from mammoth_er.model import ERConfig
    from pycil_ncm.learner import NCM as NCMLearner

    from strategies.frameworks.mammoth import MammothAdapter
    from strategies.frameworks.pycil import PyCILAdapter
    from strategies.frameworks.pycil_config import PyCILConfig
    from strategies.registry import get_strategy

    ncm, er = get_strategy(NCM), get_strategy(ER)
    assert issubclass(ncm, PyCILAdapter) and ncm.wrapped is NCMLearner and ncm.Config is PyCILConfig
    assert issubclass(er, MammothAdapter) and er.wrapped is ERModel and er.Config is ERConfig
    assert (ncm.name, er.name) == (NCM, ER)


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("pycil:mammoth_er.model:ER", "has no incremental_train(data_manager)"),
        ("mammoth:pycil_ncm.learner:NCM", "has no observe(inputs, labels, not_aug_inputs)"),
    ],
)
def test_a_class_of_the_wrong_shape_is_one_line(name, says):
    from strategies.registry import get_strategy

    with pytest.raises(UserError, match=re.escape(says)) as refused:
        get_strategy(name)
    assert "\n" not in str(refused.value)


@pytest.mark.slow
@pytest.mark.parametrize("name", [NCM, ER])
def test_a_run_killed_after_a_task_resumes_bit_identically(name, tmp_path, monkeypatch):
    from strategies.registry import get_strategy
    from tests.helpers import killed_and_resumed, run_one_run_suite, three_task_suite

    # NCM reads its batch size from args (a batch_size beside args would change nothing: refused)
    text = three_task_suite(name, "args = { batch_size = 8 }" if name == NCM else "batch_size = 8")
    suite, _, reference = run_one_run_suite(tmp_path, text)
    resumed = killed_and_resumed(monkeypatch, get_strategy(name), suite, tmp_path / "resumed", task=2)
    assert resumed["stages"] == reference["stages"]
