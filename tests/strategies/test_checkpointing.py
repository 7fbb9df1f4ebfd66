"""``strategies.checkpointing``: every kind ``pack_state`` knows round-trips exactly through
safetensors and JSON, under the keys and kind names that checkpoints already on disk use; lists of
dataclasses (GR4CIL's per-task state) and JSON values too; GR4CIL saves its state through
``checkpoint_attributes`` and still loads a model saved with its former keys of its own."""

import math
from dataclasses import dataclass, field

import pytest
import torch
from safetensors.torch import load_file

from benchmarks.core.atomic_io import read_json, write_json, write_tensors
from strategies.checkpointing import pack_state, unpack_state
from strategies.methods.gr4cil import GR4CIL, TaskState
from tests.helpers import tiny_strategy


@dataclass
class Item:
    """A dataclass of tensors and JSON values, as a strategy keeps one per task."""

    name: str
    ids: list[int]
    weight: torch.Tensor
    bias: torch.Tensor | None
    score: float | None = None
    notes: dict = field(default_factory=dict)
    steps: int = field(default=0, init=False)  # set after construction, restored all the same


@dataclass
class Other:
    weight: torch.Tensor


def _through_disk(value, tmp_path, current=None):
    """``value`` packed, written as a checkpoint writes it (safetensors, JSON), read back, unpacked."""
    kind, packed = pack_state(value)
    write_tensors(tmp_path / "t.safetensors", {f"state/x{k}": v for k, v in packed.items()})
    write_json(tmp_path / "m.json", {"kind": kind})
    tensors = {k[len("state/x") :]: v for k, v in load_file(str(tmp_path / "t.safetensors")).items()}
    return unpack_state(read_json(tmp_path / "m.json")["kind"], tensors, current)


def _items() -> list[Item]:
    first = Item(
        "visual_1", [3, 1], torch.randn(2, 4), torch.randn(4), 0.1 + 0.2, {"I-T": 1 / 3, "I-C": None}
    )
    first.steps = 5
    second = Item("visual_2", [0, 2], torch.arange(8, dtype=torch.float64).view(4, 2), None)
    return [first, second]


def _assert_items_equal(restored: list[Item], items: list[Item]) -> None:
    assert len(restored) == len(items)
    for a, b in zip(restored, items):
        assert type(a) is Item
        assert (a.name, a.ids, a.score, a.notes, a.steps) == (b.name, b.ids, b.score, b.notes, b.steps)
        assert a.weight.dtype == b.weight.dtype and torch.equal(a.weight, b.weight)
        assert (a.bias is None) == (b.bias is None)
        assert a.bias is None or torch.equal(a.bias, b.bias)


# ------------------------------------------------------------------ the kinds checkpoints already hold
@pytest.mark.parametrize(
    "value, kind, keys",
    [
        (torch.arange(6.0).view(2, 3), "tensor", [""]),
        ([torch.ones(2), torch.zeros(3, 1, dtype=torch.int64)], "list", ["/0", "/1"]),
        ((torch.ones(2),), "list", ["/0"]),
        ([], "list", []),
        (
            {"visual.proj": torch.eye(2), "conv1.weight": torch.ones(1, 2)},
            "dict",
            ["/conv1.weight", "/visual.proj"],
        ),
        ({}, "dict", []),
        (None, "none", []),
    ],
    ids=["tensor", "list", "tuple", "empty-list", "dict", "empty-dict", "none"],
)
def test_existing_kinds_keep_their_names_and_keys_and_round_trip_exactly(value, kind, keys, tmp_path):
    packed_kind, packed = pack_state(value)
    assert packed_kind == kind and sorted(packed) == keys  # what checkpoints on disk already hold
    restored = _through_disk(value, tmp_path)
    if value is None:
        assert restored is None
    elif isinstance(value, torch.Tensor):
        assert restored.dtype == value.dtype and torch.equal(restored, value)
    elif isinstance(value, (list, tuple)):
        assert isinstance(restored, list) and len(restored) == len(value)
        assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(restored, value))
    else:
        assert restored.keys() == value.keys() and all(torch.equal(restored[k], value[k]) for k in value)


def test_a_module_and_a_parameter_are_loaded_in_place(tmp_path):
    torch.manual_seed(0)
    saved, fresh = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    kind, packed = pack_state(saved)
    assert kind == "module" and sorted(packed) == ["/bias", "/weight"]
    assert _through_disk(saved, tmp_path, fresh) is fresh and torch.equal(fresh.weight, saved.weight)
    with pytest.raises(ValueError, match="re-create"):
        unpack_state(kind, packed, None)
    parameter = torch.nn.Parameter(torch.zeros(2, 3))
    assert _through_disk(torch.ones(2, 3), tmp_path, parameter) is parameter
    assert torch.equal(parameter.detach(), torch.ones(2, 3)) and parameter.requires_grad


# ------------------------------------------------------------------ lists of dataclasses, JSON values
def test_a_list_of_dataclasses_round_trips_exactly(tmp_path):
    torch.manual_seed(0)
    items = _items()
    kind, packed = pack_state(items)
    assert kind["kind"] == "dataclasses" and kind["class"].endswith(":Item")
    assert sorted(packed) == ["/0/bias", "/0/weight", "/1/weight"]  # tensors to safetensors, None to JSON
    assert kind["items"][1]["bias"] is None and "weight" not in kind["items"][0]
    _assert_items_equal(_through_disk(items, tmp_path), items)
    _assert_items_equal(unpack_state(kind, packed), items)  # from memory (a resume in-process) too


@pytest.mark.parametrize(
    "value",
    [
        [3, 1, 4],
        [[{"epoch": 1, "overall": 0.1 + 0.2}], []],
        {"auto_epochs": 7, "probe": [1.5, None]},
        2.5,
        "x",
    ],
    ids=["ids", "nested", "dict", "number", "string"],
)
def test_json_values_round_trip_exactly_and_share_nothing_with_the_strategy(value, tmp_path):
    kind, packed = pack_state(value)
    assert kind == {"kind": "json", "value": value} and packed == {}
    assert _through_disk(value, tmp_path) == value
    restored = unpack_state(kind, packed)
    if isinstance(value, list):
        value.append("changed after the checkpoint")
        assert restored != value and kind["value"] != value


def test_what_cannot_be_checkpointed_is_refused_in_one_line():
    with pytest.raises(TypeError, match="cannot checkpoint a object"):
        pack_state(object())
    with pytest.raises(TypeError, match="cannot checkpoint a float"):
        pack_state(math.nan)  # JSON without NaN, as every metadata file
    with pytest.raises(TypeError, match="cannot checkpoint a list"):
        pack_state([torch.ones(1), 2])
    with pytest.raises(TypeError, match="different dataclasses"):
        pack_state([Other(torch.ones(1)), _items()[0]])
    with pytest.raises(TypeError, match="cannot checkpoint a list"):
        pack_state([Other([torch.ones(1)])])  # a field holding tensors in a list


def test_a_dataclass_no_imported_module_defines_is_refused_not_imported():
    kind, packed = pack_state([Other(torch.ones(1))])
    kind["class"] = "no_such_module_anywhere:Other"
    with pytest.raises(ValueError, match="no imported module defines"):
        unpack_state(kind, packed)


def test_a_checkpoint_naming_a_method_module_before_the_methods_folder_still_loads():
    state = TaskState("gr4cil_t0", [0, 1], torch.ones(4, 2), None, torch.zeros(2, 4), 0.5)
    kind, packed = pack_state([state])
    assert kind["class"] == "strategies.methods.gr4cil:TaskState"
    kind["class"] = "strategies.gr4cil:TaskState"  # as a checkpoint written before the move names it
    (loaded,) = unpack_state(kind, packed)
    assert type(loaded) is TaskState and loaded.class_ids == [0, 1] and loaded.threshold == 0.5
    assert torch.equal(loaded.text_basis, state.text_basis) and loaded.head is None


# ------------------------------------------------------------------ GR4CIL through checkpoint_attributes
@pytest.fixture
def gr4cil(tiny_stream):
    """A GR4CIL with two learned tasks set by hand (the second without a compensation head)."""
    strategy = tiny_strategy(GR4CIL, tiny_stream)
    generator = torch.Generator().manual_seed(0)
    d = strategy.backbone.embed_dim
    for adapter, tower in (("text", "text"), ("visual_1", "visual"), ("visual_2", "visual")):
        strategy.add_adapter(adapter, tower=tower)
        for p in strategy.backbone.lora_parameters(adapter):  # B too, so that no adapter is all zeros
            torch.nn.init.normal_(p, generator=generator)
    strategy.tasks = [
        TaskState(
            f"visual_{t + 1}",
            list(range(10 * t, 10 * t + 10)),
            torch.randn(d, 3, generator=generator),
            torch.randn(d, 10, generator=generator) if t == 0 else None,
            torch.randn(10, d, generator=generator),
            threshold=0.4 + t / 7 if t == 0 else None,
            diagnostics={"I-T": 0.25 + t / 3, "I-C": None if t else 0.1, "I-TC": None},
        )
        for t in range(2)
    ]
    strategy.task_classes = [t.class_ids for t in strategy.tasks]
    strategy.seen_classes = strategy.anchor_ids = list(range(20))
    strategy.anchors = torch.randn(20, d, generator=generator)
    strategy.modality_gap = [[{"epoch": 1, "overall": 0.15, "positive": 1 / 3, "negative": 0.07}], []]
    strategy.backbone.set_adapters(visual=None, text=None)
    return strategy


def _assert_same_gr4cil_state(loaded: GR4CIL, saved: GR4CIL) -> None:
    assert len(loaded.tasks) == len(saved.tasks)
    for a, b in zip(loaded.tasks, saved.tasks):
        assert (a.adapter, a.class_ids, a.threshold, a.diagnostics) == (
            b.adapter,
            b.class_ids,
            b.threshold,
            b.diagnostics,
        )
        assert torch.equal(a.text_basis, b.text_basis) and torch.equal(a.prototypes, b.prototypes)
        assert (a.head is None and b.head is None) or torch.equal(a.head, b.head)
    assert torch.equal(loaded.anchors, saved.anchors) and loaded.anchor_ids == saved.anchor_ids
    assert loaded.modality_gap == saved.modality_gap
    assert loaded.backbone.active_adapters == {"visual": "visual_2", "text": "text"}
    for adapter in ("text", "visual_1", "visual_2"):
        mine, theirs = loaded.backbone.lora_state_dict(adapter), saved.backbone.lora_state_dict(adapter)
        assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_gr4cil_saves_its_tasks_through_checkpoint_attributes_and_loads_them_exactly(
    gr4cil, tiny_stream, tmp_path
):
    tensors, meta = gr4cil.checkpoint_state()
    state_keys = {k for k in tensors if not k.startswith("lora/")}
    assert state_keys == {
        "state/tasks/0/text_basis",
        "state/tasks/0/head",
        "state/tasks/0/prototypes",
        "state/tasks/1/text_basis",
        "state/tasks/1/prototypes",
        "state/anchors",
    }
    assert set(meta["state_kinds"]) == {"tasks", "anchors", "anchor_ids", "modality_gap"}
    gr4cil.save_model(tmp_path / "m")
    fresh = tiny_strategy(GR4CIL, tiny_stream)
    fresh.load_model(tmp_path / "m")
    _assert_same_gr4cil_state(fresh, gr4cil)
    resumed = tiny_strategy(GR4CIL, tiny_stream)  # a resume in the same process: no files between
    resumed.load_checkpoint_state(tensors, meta)
    _assert_same_gr4cil_state(resumed, gr4cil)


def test_gr4cil_loads_a_model_saved_with_its_former_keys(gr4cil, tiny_stream, tmp_path):
    """Models saved before GR4CIL used ``checkpoint_attributes`` (``save_model``'s files) still load:
    the files are written here as its hand-written ``checkpoint_state`` wrote them."""
    tensors, meta = gr4cil.checkpoint_state()
    tensors = {k: v for k, v in tensors.items() if k.startswith("lora/")}
    meta["state_kinds"] = {}
    for i, state in enumerate(gr4cil.tasks, start=1):
        tensors[f"tasks/{i}/text_basis"] = state.text_basis
        tensors[f"tasks/{i}/prototypes"] = state.prototypes
        tensors[f"tasks/{i}/class_ids"] = torch.tensor(state.class_ids)
        if state.head is not None:
            tensors[f"tasks/{i}/compensation_head"] = state.head
    tensors["anchors/features"] = gr4cil.anchors
    tensors["anchors/class_ids"] = torch.tensor(gr4cil.anchor_ids, dtype=torch.long)
    meta["gr4cil"] = {
        "tasks": [
            {"adapter": t.adapter, "threshold": t.threshold, "diagnostics": t.diagnostics}
            for t in gr4cil.tasks
        ],
        "modality_gap": gr4cil.modality_gap,
    }
    write_tensors(tmp_path / "old.safetensors", tensors)
    write_json(
        tmp_path / "old.json",
        {
            "strategy": "gr4cil",
            "config": gr4cil.cfg.to_dict(),
            "class_names": gr4cil.class_names,
            "state": meta,
        },
    )
    fresh = tiny_strategy(GR4CIL, tiny_stream)
    fresh.load_model(tmp_path / "old")
    _assert_same_gr4cil_state(fresh, gr4cil)


@pytest.mark.parametrize(
    "value",
    [
        torch.arange(6.0).view(2, 3),
        [torch.ones(2), torch.zeros(3, 1), torch.full((1,), 7.0)],
        {"visual.proj": torch.eye(2), "conv1.weight": torch.ones(1, 2)},
        None,
    ],
    ids=["tensor", "list", "dict", "none"],
)
def test_pack_state_round_trips_every_kind(value):
    kind, packed = pack_state(value)
    restored = unpack_state(kind, {k: v.clone() for k, v in packed.items()})
    if value is None:
        assert restored is None and packed == {}
    elif isinstance(value, torch.Tensor):
        assert set(packed) == {""} and torch.equal(restored, value)
    elif isinstance(value, list):
        assert sorted(packed) == ["/0", "/1", "/2"] and all(
            torch.equal(a, b) for a, b in zip(restored, value, strict=True)
        )
    else:
        assert restored.keys() == value.keys() and all(torch.equal(restored[k], value[k]) for k in value)


def test_pack_state_loads_a_module_into_its_recreated_twin():
    torch.manual_seed(0)
    saved, fresh = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    kind, packed = pack_state(saved)
    assert kind == "module" and set(packed) == {"/weight", "/bias"}
    assert unpack_state(kind, packed, fresh) is fresh and torch.equal(fresh.weight, saved.weight)
    with pytest.raises(ValueError, match="re-create"):
        unpack_state(kind, packed, None)


def test_rows_of_tensors_and_a_dtype_round_trip_exactly(tmp_path):
    """RAPF keeps a tuple of three 0-d tensors a class, and the dtype it computes in."""
    rows = [(torch.tensor(0.5), torch.tensor(1.25), torch.tensor(2.0)), [torch.ones(2, dtype=torch.float64)]]
    kind, packed = pack_state(rows)
    assert kind == {"kind": "rows", "rows": [{"length": 3, "tuple": True}, {"length": 1, "tuple": False}]}
    assert sorted(packed) == ["/0/0", "/0/1", "/0/2", "/1/0"]
    restored = _through_disk(rows, tmp_path)
    assert isinstance(restored[0], tuple) and isinstance(restored[1], list)
    for a, b in zip(restored, rows, strict=True):
        assert all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b, strict=True))
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        assert pack_state(dtype) == ({"kind": "dtype", "value": str(dtype)[len("torch.") :]}, {})
        assert _through_disk(dtype, tmp_path) is dtype
    with pytest.raises(ValueError, match="unknown torch dtype 'nn'"):
        unpack_state({"kind": "dtype", "value": "nn"}, {})
