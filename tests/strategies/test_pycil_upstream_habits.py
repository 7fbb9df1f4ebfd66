"""The ``pycil:`` adapter meets each habit of PyCIL's learners with no edit to the learner
(``tests/strategies/pycil_shaped/``, written here in PyCIL's shape): options from the suite's
``args``, epochs kept as module constants and scaled by the suite, a network factory answered with
the run's CLIP, its own test loader served without the test set, exemplars through ``appendent``,
``--quiet``, one-line errors for ``.cuda()`` and a missing option, and resumes that keep the
numbers (or start over and say so)."""

import copy
import importlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.core.errors import UserError
from strategies.settings import RunSettings

SHAPED = Path(__file__).parent / "pycil_shaped"
ICARL = "pycil:pycil_learners.icarl_like:ICaRLLike"
ORDER = list(range(12))


@pytest.fixture(autouse=True)
def _shaped_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(SHAPED))


def built(name, stream, show_progress=False, config=None, plugins=None, **options):
    from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
    from strategies.registry import get_strategy

    cls = get_strategy(name)
    torch.manual_seed(0)
    return cls(
        backbone=create_clip(BackboneSpec(TINY_MODEL, "synthetic")),
        class_names=stream.class_names,
        config=config or cls.Config.from_dict(options, name),
        settings=RunSettings(show_progress=show_progress, seed=0),
        plugins=plugins,
    )


def learn(strategy, stream, tasks):
    for task in tasks:
        torch.manual_seed(task)  # as the runner seeds every task
        strategy.learn(stream.train_stream[task])


def test_args_reach_the_learner_and_clip_is_its_convnet(stream):
    strategy = built(ICARL, stream, args={"memory_size": 12})
    learner = strategy.learner
    assert learner._memory_size == 12
    # the family's own factory, asked for "clip" (the default), gave the run's image tower
    assert learner._network.convnet.backbone is strategy.backbone
    assert learner._network.feature_dim == strategy.backbone.embed_dim
    other = built(ICARL, stream, args={"memory_size": 12, "convnet_type": "tinyconv"})
    assert type(other.learner._network.convnet).__name__ == "TinyConv"


def test_the_module_constants_follow_the_epoch_scale_and_are_put_back(stream):
    import pycil_learners.icarl_like as module

    from strategies.frameworks.pycil_config import PyCILConfig

    strategy = built(ICARL, stream, config=PyCILConfig(args={"memory_size": 12}).with_epoch_scale(0.25)[0])
    learn(strategy, stream, [0, 1])
    assert strategy.learner.epochs_run == [4, 2]  # 16 and 8, times 0.25
    assert strategy.scaled_constants["pycil_learners.icarl_like.init_milestones"] == ([8, 12], [2, 3])
    assert (module.init_epoch, module.epochs, module.milestones) == (16, 8, [4, 6])  # as written


def test_the_fast_dev_run_caps_epoch_args_and_constants():
    from strategies.frameworks.pycil_config import PyCILConfig

    config, changed = PyCILConfig(args={"init_epoch": 200, "tuned_epochs": 20, "lr": 0.1}).with_epoch_scale(
        0.125
    )
    assert config.args == {"init_epoch": 25, "tuned_epochs": 2, "lr": 0.1} and changed == [
        "args",
        "epoch_scale",
    ]
    capped, _ = config.with_epoch_cap(1)
    assert capped.args["init_epoch"] == 1 and capped.epoch_cap == 1


def test_an_epoch_word_anywhere_in_a_name_makes_it_an_epoch_count():
    from strategies.frameworks.pycil_config import PyCILConfig

    # C3Box's CLG-CBM: FB_epoch for the first task, FB_epoch_inc for the others (both epochs)
    args = {"FB_epoch": 60, "FB_epoch_inc": 60, "epochs_x": 8, "epochal": 7, "repoch": 5, "sg_num": 1}
    config, _ = PyCILConfig(args=args).with_epoch_scale(0.125)
    scaled = {"FB_epoch": 8, "FB_epoch_inc": 8, "epochs_x": 1}
    assert config.args == {**scaled, "epochal": 7, "repoch": 5, "sg_num": 1}


def test_its_own_test_loader_gets_training_images_never_the_test_set(stream):
    strategy = built(ICARL, stream, args={"memory_size": 12})
    with pytest.warns(UserWarning, match="not the test set"):
        learn(strategy, stream, [0, 1])
    manager = strategy.data_manager
    items = strategy.learner.test_loader_items[1]
    assert len(items) == 8 * min(6, 10)  # every seen class, its training images (6 here)
    tasks = items >> 32
    assert set(tasks.tolist()) == {0, 1}  # the first task's classes from the stream's first experience
    for item_id in items[:: len(items) // 4]:
        task, index = int(item_id) >> 32, int(item_id) & (2**32 - 1)
        train = stream.train_stream[task].dataset.eval()
        assert torch.equal(manager._image(int(item_id), "test"), train[index][0])


def test_exemplars_go_through_appendent_and_come_back_as_images(stream):
    strategy = built(ICARL, stream, args={"memory_size": 16})
    learn(strategy, stream, [0, 1])
    learner = strategy.learner
    assert len(learner._data_memory) == 16 and sorted(set(learner._targets_memory.tolist())) == list(range(8))
    assert learner.train_size == 4 * 6 + 16  # task 2's images, plus task 1's exemplars (16 // 4 a class)
    # an exemplar is an item of the class its target names, from the task that taught it
    for item_id, position in zip(learner._data_memory, learner._targets_memory):
        task, index = int(item_id) >> 32, int(item_id) & (2**32 - 1)
        assert stream.train_stream[task].dataset.targets[index] == strategy.seen_classes[position]


def test_a_checkpoint_keeps_memory_old_network_and_means(stream):
    strategy = built(ICARL, stream, args={"memory_size": 12})
    learn(strategy, stream, [0])
    tensors, meta = strategy.checkpoint_state()
    saved = meta["learner"]["attributes"]
    assert {"_data_memory", "_targets_memory", "_class_means", "_old_network"} <= set(saved)
    assert meta["learner"]["unsaved"] == []
    assert not any(
        k.startswith("learner/_old_network/convnet.backbone") for k in tensors
    )  # the pristine tower
    fresh = built(ICARL, stream, args={"memory_size": 12})
    fresh.load_checkpoint_state(tensors, meta)
    learn(strategy, stream, [1])
    learn(fresh, stream, [1])
    images = torch.stack([stream.test_set[i][0] for i in range(len(stream.test_set))])
    assert torch.equal(strategy.scores(images), fresh.scores(images))
    assert np.array_equal(strategy.learner._data_memory, fresh.learner._data_memory)


def test_state_a_checkpoint_cannot_hold_means_starting_over(stream):
    strategy = built("pycil:pycil_learners.habits:KeepsAGenerator", stream, args={"memory_size": 0})
    learn(strategy, stream, [0])
    _, meta = strategy.checkpoint_state()
    assert meta["learner"]["unsaved"] == ["draws"]
    assert "draws" in strategy.resume_refusal(meta)


def test_modules_kept_outside_the_networks_state_dict_mean_starting_over(stream):
    strategy = built("pycil:pycil_learners.habits:KeepsAdaptersInAList", stream, args={"memory_size": 0})
    learn(strategy, stream, [0, 1])
    _, meta = strategy.checkpoint_state()
    assert meta["learner"]["unsaved"] == ["_network.finished (2 module(s) outside its state dict)"]
    assert "_network.finished" in strategy.resume_refusal(meta)
    # a network whose lists hold only its own registered modules saves whole, and resumes
    strategy = built("pycil:pycil_learners.habits:NeedsCuda", stream, args={"memory_size": 0})
    strategy.network.blocks = [strategy.network.fc]
    _, meta = strategy.checkpoint_state()
    assert meta["learner"]["unsaved"] == [] and strategy.resume_refusal(meta) is None


def test_a_fresh_copy_of_the_runs_clip_outside_the_state_dict_loses_nothing():
    from strategies.frameworks.pycil_state import (
        changed_outside,
        fingerprint,
        modules_outside_state_dict,
        tensors_as_built,
    )

    # C3Box's APER rebuilds its network in a task; the new one keeps a fresh factory copy of the
    # run's CLIP in a tuple: made after the learner was built, yet equal to the run's CLIP
    clip = torch.nn.Linear(3, 3)
    network = torch.nn.Module()
    built = tensors_as_built(modules_outside_state_dict(network))
    network.convnet = (copy.deepcopy(clip), "preprocess", "tokenizer")
    assert changed_outside(network, built) == ["_network.convnet (1 module(s) outside its state dict)"]
    assert changed_outside(network, built, frozenset({fingerprint(clip)})) == []
    with torch.no_grad():
        network.convnet[0].weight[0, 0] += 1e-3  # trained: no longer the run's CLIP
    assert changed_outside(network, built, frozenset({fingerprint(clip)})) != []


def test_cuda_on_a_cpu_machine_is_one_line(stream):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    strategy = built("pycil:pycil_learners.habits:NeedsCuda", stream, args={"memory_size": 0})
    with pytest.raises(UserError) as refused:
        learn(strategy, stream, [0])
    message = str(refused.value)
    assert "\n" not in message and "calls CUDA at pycil_learners/habits.py:" in message


def test_an_option_it_needs_and_lacks_is_one_line_naming_its_file(stream):
    with pytest.raises(UserError) as refused:
        built(ICARL, stream)
    message = str(refused.value)
    assert "\n" not in message
    assert "KeyError: 'memory_size' at pycil_learners/base.py:" in message and "(__init__)" in message
    assert "building the learner" in message and "the suite passed args" in message


def test_an_option_outside_args_points_to_args():
    from strategies.registry import get_strategy

    with pytest.raises(UserError, match=r"args = \{ memory_size = \.\.\. \}"):
        get_strategy(ICARL).Config.from_dict({"memory_size": 12}, ICARL)
    with pytest.raises(UserError, match="the run's"):
        get_strategy(ICARL).Config.from_dict({"args": {"device": "cuda"}}, ICARL)


def test_a_plugin_it_cannot_run_is_refused_in_one_line(stream):
    from benchmarks.runner.live_log import TrainingLog

    with pytest.raises(UserError, match=r"Avalanche plugins \(TrainingLog\) cannot attach") as err:
        built(ICARL, stream, plugins=[TrainingLog(log=None)], args={"memory_size": 12})
    assert "\n" not in str(err.value) and "live log, --log, holds its stages" in str(err.value)


def test_quiet_silences_its_bars_and_logging(stream, capsys, caplog):
    import logging

    caplog.set_level(logging.INFO)
    strategy = built(ICARL, stream, args={"memory_size": 12}, show_progress=False)
    learn(strategy, stream, [0])
    assert "icarl-like" not in capsys.readouterr().err and "test accuracy" not in caplog.text
    loud = built(ICARL, stream, args={"memory_size": 12}, show_progress=True)
    learn(loud, stream, [0])
    assert "icarl-like" in capsys.readouterr().err and "test accuracy" in caplog.text


@pytest.mark.slow
def test_a_run_killed_in_task_two_resumes_bit_identically(tmp_path, monkeypatch):
    from strategies.registry import get_strategy
    from tests.helpers import killed_and_resumed, run_one_run_suite, three_task_suite

    monkeypatch.setenv("PYTHONPATH", str(SHAPED))
    text = three_task_suite(ICARL, "args = { memory_size = 15 }")
    suite, _, reference = run_one_run_suite(tmp_path, text)
    assert reference["diagnostics"]["epoch_constants"] == {}  # the suite has no epoch_scale
    resumed = killed_and_resumed(monkeypatch, get_strategy(ICARL), suite, tmp_path / "resumed", task=2)
    assert resumed["stages"] == reference["stages"]
    assert (reference["cost"]["resumed_from"], resumed["cost"]["resumed_from"]) == ([], [1])
    assert sys.modules["pycil_learners.icarl_like"].init_epoch == 16


@pytest.mark.slow
def test_a_learner_whose_state_cannot_be_saved_starts_over_and_the_result_says_so(tmp_path, monkeypatch):
    from strategies.registry import get_strategy
    from tests.helpers import killed_and_resumed, three_task_suite, write_suite

    name = "pycil:pycil_learners.habits:KeepsAGenerator"
    suite = write_suite(
        tmp_path / "suite.toml",
        three_task_suite(name, 'args = { memory_size = 0, convnet_type = "tinyconv" }'),
    )
    resumed = killed_and_resumed(monkeypatch, get_strategy(name), suite, tmp_path / "results", task=2)
    assert resumed["cost"]["resumed_from"] == [0] and len(resumed["stages"]) == 3


@pytest.mark.slow
def test_a_network_grown_outside_update_fc_starts_over_and_says_why(tmp_path, monkeypatch):
    from strategies.registry import get_strategy
    from tests.helpers import killed_and_resumed, run_one_run_suite, three_task_suite

    name = "pycil:pycil_learners.habits:GrowsOutsideUpdateFc"
    text = three_task_suite(name, 'args = { memory_size = 0, convnet_type = "tinyconv" }')
    suite, _, reference = run_one_run_suite(tmp_path, text)
    with pytest.warns(UserWarning, match=r"ran again from task 1 \(its network grows what update_fc does not "
                      r"rebuild \(projs\.0\.bias, projs\.0\.weight\)\)"):  # fmt: skip
        resumed = killed_and_resumed(monkeypatch, get_strategy(name), suite, tmp_path / "again", task=2)
    assert resumed["cost"]["resumed_from"] == [0]  # before: "the checkpoint does not fit" ended the rerun
    assert resumed["stages"] == reference["stages"]


def test_a_learner_keeping_aliases_is_checkpointed_and_restored_with_its_aliases(stream, tmp_path):
    from strategies.checkpointing import load_model, save_model

    name = "pycil:pycil_learners.aliases:KeepsAliases"
    options = {"args": {"memory_size": 0, "convnet_type": "tinyconv"}}
    strategy = built(name, stream, **options)
    learn(strategy, stream, [0])
    save_model(strategy, tmp_path / "after-task-1")  # safetensors refused the shared memory before
    fresh = built(name, stream, **options)
    load_model(fresh, tmp_path / "after-task-1")
    learner = fresh.learner
    assert learner._network_module_ptr is learner._network
    assert learner._fc_weight is learner._network.fc.weight
    assert learner._protos_of_old is learner._protos
    assert torch.equal(learner._fc_values, strategy.learner._fc_values)
    learn(strategy, stream, [1])
    learn(fresh, stream, [1])
    assert fresh.learner._network_module_ptr is fresh.learner._network
    images = torch.stack([stream.test_set[i][0] for i in range(len(stream.test_set))])
    assert torch.equal(strategy.scores(images), fresh.scores(images))


def test_a_learners_own_modules_dtype_and_rows_of_tensors_are_checkpointed_and_restored(stream, tmp_path):
    from strategies.checkpointing import load_model, save_model

    name = "pycil:pycil_learners.own_state:KeepsItsOwnModules"
    options = {"args": {"memory_size": 0, "convnet_type": "tinyconv"}}
    strategy = built(name, stream, **options)
    learn(strategy, stream, [0])
    save_model(strategy, tmp_path / "after-task-1")  # these were "cannot be saved": a start over
    fresh = built(name, stream, **options)
    assert fresh.resume_refusal(strategy.checkpoint_state()[1]) is None
    load_model(fresh, tmp_path / "after-task-1")
    learner, saved = fresh.learner, strategy.learner
    assert learner.dtype is torch.float32
    assert torch.equal(learner.adapter.weight, saved.adapter.weight)
    assert learner.adapter.weight.requires_grad and learner.adapter.training
    old = learner.old_adapter  # None in a fresh learner: a copy of its adapter, loaded
    assert old is not learner.adapter and torch.equal(old.weight, saved.old_adapter.weight)
    assert not old.weight.requires_grad and not old.training
    assert [tuple(map(float, row)) for row in learner.edges] == [tuple(map(float, r)) for r in saved.edges]
    assert all(isinstance(row, tuple) for row in learner.edges)
    learn(strategy, stream, [1])
    learn(fresh, stream, [1])
    assert torch.equal(fresh.learner.adapter.weight, strategy.learner.adapter.weight)


def test_args_stay_a_dict_for_upstream_code_and_record_every_lookup():
    import copy
    import json
    import pickle

    from strategies.frameworks.pycil_config import ReadArgs

    args = ReadArgs({"memory_size": 12, "convnet_type": "clip"})
    assert isinstance(args, dict) and json.dumps(args) == '{"memory_size": 12, "convnet_type": "clip"}'
    assert args == {"memory_size": 12, "convnet_type": "clip"} and not args.looked_up
    assert args["memory_size"] == 12 and args.get("init_lr", 0.1) == 0.1 and "fixed_memory" not in args
    assert args.looked_up == {"memory_size", "init_lr", "fixed_memory"}  # missing keys count too
    for copied in (copy.copy(args), copy.deepcopy(args), args.copy()):
        assert type(copied) is ReadArgs and copied == args and copied is not args
        copied["convnet_type"]  # a learner reading its own copy
    assert "convnet_type" in args.looked_up
    assert pickle.loads(pickle.dumps(args)) == args


def test_an_args_key_the_learner_never_reads_is_named_with_the_key_it_looked_up(stream):
    name = "pycil:pycil_learners.habits:KeepsAGenerator"
    args = {"memory_size": 0, "convnet_type": "tinyconv", "memroy_size": 20, "lambda_kd": 3.0}
    strategy = built(name, stream, args=args)
    with pytest.warns(UserWarning) as said:
        learn(strategy, stream, [0])
    (early,) = [str(w.message) for w in said if "never read" in str(w.message)]
    assert early == (
        f"{name}: the learner never read args 'memroy_size' (did you mean 'memory_size'?) in task 1, so "
        "they changed nothing; check their spelling against the learner's code"
    )
    with pytest.warns(UserWarning) as said:
        learn(strategy, stream, [1, 2])
    (last,) = [str(w.message) for w in said if "never read" in str(w.message)]
    assert "args 'lambda_kd' in the whole run" in last and "memroy_size" not in last  # each named once


def test_a_recipe_field_the_learner_never_reads_is_refused_in_one_line():
    from strategies.registry import get_strategy

    config = get_strategy(ICARL).Config
    with pytest.raises(UserError) as refused:
        config.from_dict({"lr": 0.1, "lora_rank": 8, "args": {"memory_size": 12}}, ICARL)
    message = str(refused.value)
    assert message.startswith(f"lr, lora_rank of {ICARL} would change nothing: the learner reads its options")
    assert (
        "args = { lr = ... }" in message
        and "\n" not in message
        and refused.value.options == ("lr", "lora_rank")
    )
    # a default, and what the runner reads itself, are no refusal
    taken = config.from_dict({"lr": 0.005, "eval_batch_size": 100, "num_workers": 2, "args": {}}, ICARL)
    assert (taken.eval_batch_size, taken.num_workers) == (100, 2)


def test_a_fast_dev_run_caps_the_learners_epochs_not_a_batch_size_it_never_reads():
    from benchmarks.runner.building import _limited_config
    from benchmarks.runner.limits import RunLimits
    from strategies.frameworks.pycil_config import PyCILConfig

    sources = {"batch_size": "default", "epoch_cap": "default", "args": "strategy"}
    capped = _limited_config(PyCILConfig(args={"init_epoch": 20}), RunLimits.fast_dev_run(), sources)
    assert (capped.batch_size, capped.args["init_epoch"]) == (64, 1)
    assert sources["batch_size"] == "default"  # the run's line does not claim a cap that changed nothing


def test_a_suites_common_and_defaults_tables_leave_the_unread_recipe_out():
    from benchmarks.data.protocols import ProtocolLayer
    from benchmarks.runner.suites import strategy_options

    suite = {
        "common": {"lr": 0.01, "train_augmentation": "paper-scaled"},
        "defaults": {"lora_rank": 8, "eval_batch_size": 500},
        "strategy": {ICARL: {"args": {"memory_size": 12}}},
    }
    options, sources = strategy_options(suite, ICARL, "synthetic", ProtocolLayer())
    assert options == {
        "train_augmentation": "paper-scaled",
        "eval_batch_size": 500,
        "args": {"memory_size": 12},
    }
    finetune, _ = strategy_options(suite, "finetune", "synthetic", ProtocolLayer())
    assert finetune["lora_rank"] == 8 and finetune["lr"] == 0.01  # the suite's own strategies take them


@pytest.mark.parametrize("workers", [0, 2])
def test_the_modules_loader_workers_follow_the_runs_num_workers_and_are_put_back(stream, workers):
    import pycil_learners.workers as module

    name = "pycil:pycil_learners.workers:EightWorkers"
    with pytest.warns(UserWarning) as said:
        strategy = built(
            name, stream, num_workers=workers, args={"memory_size": 0, "convnet_type": "tinyconv"}
        )
    lines = [str(w.message) for w in said if "loader workers" in str(w.message)]
    assert lines == [
        f"{name}: loader workers of its module as run (the run's num_workers): "
        f"pycil_learners.workers.num_workers 8 -> {workers}"
    ]
    learn(strategy, stream, [0, 1])
    assert strategy.learner.workers_seen == [workers, workers] and module.num_workers == 8  # as written


@pytest.mark.slow
def test_a_run_killed_while_its_loader_has_workers_leaves_no_worker_behind(tmp_path):
    """kill -9 of a run process in an epoch of a learner's loader with workers (persistent ones, the
    longest-lived kind): torch's workers watch their parent and end within seconds."""
    import signal
    import subprocess
    import time

    import psutil

    script = (
        "import time, torch\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "from benchmarks.runner.launcher import prepare_runner_process\n"
        "prepare_runner_process()  # as a run process starts\n"
        "class Slow(Dataset):\n"
        "    def __len__(self): return 10_000\n"
        "    def __getitem__(self, i): time.sleep(0.05); return torch.zeros(1)\n"
        "batches = iter(DataLoader(Slow(), batch_size=2, num_workers=2, persistent_workers=True))\n"
        "next(batches)\n"
        "print(*(w.pid for w in batches._workers), flush=True)\n"
        "time.sleep(600)\n"
    )
    root = Path(__file__).resolve().parents[2]
    run = subprocess.Popen([sys.executable, "-c", script], cwd=root, stdout=subprocess.PIPE, text=True)
    try:
        workers = [psutil.Process(int(pid)) for pid in run.stdout.readline().split()]
        assert len(workers) == 2 and all(w.is_running() for w in workers)
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()

    def ended(worker) -> bool:
        try:
            return not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    deadline = time.monotonic() + 30  # torch's workers look at their parent every 5 s
    while not all(map(ended, workers)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert all(map(ended, workers)), [w.pid for w in workers if not ended(w)]


def _upstream_line(tmp_path, learner: str, module: str, call, forget: tuple[str, ...] = ()) -> str:
    """The one line ``running_upstream`` gives for ``call(module)``, ``module`` imported from files
    under ``tmp_path`` (and forgotten after, with ``forget``)."""
    from strategies.frameworks.upstream import running_upstream

    sys.path.insert(0, str(tmp_path))
    try:
        imported = importlib.import_module(module)
        with pytest.raises(UserError) as caught:
            with running_upstream(tmp_path, learner, "building the learner", lambda: "{}"):
                call(imported)
    finally:
        sys.path.remove(str(tmp_path))
        for name in (module, *forget):
            sys.modules.pop(name, None)
    return str(caught.value)


def test_a_file_its_code_cannot_parse_is_named_with_its_size(tmp_path):
    # C3Box's ENGINE json.load()s one description file a dataset; an empty one reads as
    # "Expecting value: line 1 column 1", which names no file
    (tmp_path / "chat").mkdir()
    (tmp_path / "chat" / "aircraft_des.json").write_text("")
    (tmp_path / "engine_like.py").write_text(
        "import json\ndef read(name):\n    with open(name) as f:\n        return json.load(f)\n"
    )
    described = tmp_path / "chat" / "aircraft_des.json"
    line = _upstream_line(tmp_path, "engine", "engine_like", lambda engine: engine.read(str(described)))
    assert line.startswith(
        f"engine: JSONDecodeError: Expecting value: line 1 column 1 (char 0) in "
        f"{described} (0 bytes) at engine_like.py:4 (read)"
    )


def test_a_function_missing_from_an_empty_module_file_names_that_file(tmp_path):
    # C3Box's MG-CLIP calls loralib.utils.mark_only_lora_as_trainable, and its loralib/utils.py is
    # the empty blob: "has no attribute" alone does not say the checkout lacks the file's content
    package = tmp_path / "lora_like"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "utils.py").write_text("")
    (tmp_path / "model_like.py").write_text(
        "from lora_like import utils\ndef build():\n    utils.mark_only_lora_as_trainable(None)\n"
    )
    forget = ("lora_like", "lora_like.utils")
    line = _upstream_line(tmp_path, "mind", "model_like", lambda model: model.build(), forget)
    assert line.startswith(
        "mind: AttributeError: module 'lora_like.utils' has no attribute 'mark_only_lora_as_trainable' "
        f"(its file {Path('lora_like') / 'utils.py'} is empty: 0 bytes in the checkout) "
        "at model_like.py:3 (build)"
    )
    (package / "utils.py").write_text("# not empty\n")  # a file with content: the line as before
    line = _upstream_line(tmp_path, "mind", "model_like", lambda model: model.build(), forget)
    assert "has no attribute 'mark_only_lora_as_trainable'" in line and "is empty" not in line


def test_the_modules_under_a_root_include_those_imported_since_the_last_look(tmp_path):
    """An adapter looks for its code's modules at every build and task; each look sees what was
    imported since, through a link to the code's folder too, and nothing outside the folder."""
    from strategies.frameworks.upstream import modules_under

    code = tmp_path / "code"
    code.mkdir()
    (code / "first_of_two.py").write_text("X = 1\n")
    (code / "second_of_two.py").write_text("Y = 2\n")
    (tmp_path / "link").symlink_to(code)
    sys.path.insert(0, str(tmp_path / "link"))  # imported through the link: resolved to the folder
    try:
        first = importlib.import_module("first_of_two")
        assert modules_under(code.resolve()) == [first]
        second = importlib.import_module("second_of_two")
        assert sorted(m.__name__ for m in modules_under(code.resolve())) == ["first_of_two", "second_of_two"]
        assert second not in modules_under((tmp_path / "elsewhere").resolve())
    finally:
        sys.path.remove(str(tmp_path / "link"))
        for name in ("first_of_two", "second_of_two"):
            sys.modules.pop(name, None)
