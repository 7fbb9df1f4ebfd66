"""Structures sized per task read the stream's real task sizes on a half-base split (12 classes as
B6-Inc3: tasks of 6, 3 and 3): CODA-Prompt's component slices, PyCIL's ``get_task_size`` and
Mammoth's ``N_CLASSES_PER_TASK`` and offsets, through a resume."""

import pytest
import torch

from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
from benchmarks.data.datasets import load_dataset
from benchmarks.data.streams import build_stream
from benchmarks.data.transforms import eval_transform
from strategies.contract import stream_task_sizes
from strategies.registry import get_strategy
from strategies.settings import RunSettings
from tests.strategies.test_mammoth_upstream_habits import (  # noqa: F401 (the shaped checkout's fixture)
    DISTILL,
    _shaped_on_path,
    built,
    learn,
)

ORDER = [7, 3, 11, 0, 5, 9, 1, 2, 10, 4, 8, 6]


@pytest.fixture(scope="module")
def half_base():
    data = load_dataset("synthetic", n_classes=12, n_train_per_class=6, n_test_per_class=3)
    return build_stream(data, "B6-Inc3", ORDER, eval_transform(32), eval_transform(32))


def test_the_stream_gives_every_tasks_size(half_base):
    assert [len(t) for t in half_base.tasks] == [6, 3, 3]
    for experience in half_base.train_stream:
        assert stream_task_sizes(experience) == [6, 3, 3]
    assert stream_task_sizes(object()) is None


def test_coda_prompt_gives_each_of_the_streams_tasks_one_slice(half_base):
    cls = get_strategy("coda_prompt")
    config = cls.Config.from_dict(
        {"prompt_layers": [0, 1, 2, 3], "components": 12, "epochs": 1, "batch_size": 16}, "coda_prompt"
    )
    torch.manual_seed(0)
    strategy = cls(
        backbone=create_clip(BackboneSpec(TINY_MODEL, "synthetic")),
        class_names=half_base.class_names,
        config=config,
        settings=RunSettings(show_progress=False),
    )
    slices = []
    for experience in half_base.train_stream:  # all classes / the first task's would be 2 tasks of 6
        strategy.learn(experience)
        slices.append(strategy.slice)
    assert strategy.stream_tasks == 3 and strategy.per_task == 12 // 3
    assert slices == [(0, 4), (4, 8), (8, 12)]
    _, meta = strategy.checkpoint_state()
    assert meta["state_kinds"]["stream_tasks"] == {"kind": "json", "value": 3}


def test_pycils_data_manager_knows_every_tasks_size_from_the_first(half_base, monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "examples" / "pycil_ncm"))
    cls = get_strategy("pycil:pycil_ncm.learner:NCM")
    torch.manual_seed(0)
    strategy = cls(
        backbone=create_clip(BackboneSpec(TINY_MODEL, "synthetic")),
        class_names=half_base.class_names,
        config=cls.Config(batch_size=8),
        settings=RunSettings(show_progress=False, seed=0),
    )
    strategy.learn(half_base.train_stream[0])
    manager = strategy.data_manager
    # PyCIL's _increments: the base, then the increments, each known before its task
    assert [manager.get_task_size(t) for t in range(3)] == [6, 3, 3] and manager.nb_tasks == 3
    strategy.learn(half_base.train_stream[1])
    assert manager.class_order == ORDER[:9] and manager.task_sizes == [6, 3]


def test_a_mammoth_model_gets_the_task_sizes_and_offsets_and_resumes(half_base):
    strategy = built(DISTILL, half_base)
    learn(strategy, half_base, [0, 1])
    assert strategy.data.N_CLASSES_PER_TASK == [6, 3, 3] and strategy.data.N_TASKS == 3
    assert [strategy.data.get_offsets(t) for t in range(3)] == [(0, 6), (6, 9), (9, 12)]
    assert (strategy.model.n_past_classes, strategy.model.n_seen_classes) == (6, 9)
    tensors, meta = strategy.checkpoint_state()
    restored = built(DISTILL, half_base)
    restored.load_checkpoint_state(tensors, meta)
    assert restored.data.N_CLASSES_PER_TASK == [6, 3, 3]
    learn(strategy, half_base, [2])
    learn(restored, half_base, [2])
    assert (restored.model.n_past_classes, restored.model.n_seen_classes) == (9, 12)
    images = torch.stack([half_base.test_set[i][0] for i in range(len(half_base.test_set))])
    assert torch.equal(restored.scores(images), strategy.scores(images))
    assert strategy.seen_classes == ORDER
