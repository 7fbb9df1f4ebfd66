"""Results store (atomic, cached by config hash, corrupt files) and suite expansion."""

import json
from pathlib import Path

import pytest

from benchmarks.core.atomic_io import read_json
from benchmarks.core.errors import UserError
from benchmarks.runner.reading import iter_results
from benchmarks.runner.result_record import REQUIRED_KEYS, config_hash
from benchmarks.runner.results import ResultStore, RunKey
from benchmarks.runner.suites import available_suites, expand, load_suite


def test_config_hash_ignores_key_order_but_not_values():
    assert config_hash({"a": 1, "b": {"c": 2}}) == config_hash({"b": {"c": 2}, "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})


def test_store_returns_finished_result_only_for_same_config(tmp_path):
    store = ResultStore(tmp_path)
    key = RunKey("finetune", "synthetic", 10, 0)
    result = {k: None for k in REQUIRED_KEYS} | {
        "schema_version": 1,
        "config_hash": "abc",
        "stages": [],
        "label": "finetune",
    }
    stored = store.save(key, result)
    assert store.result_path(key) == tmp_path / "synthetic" / "finetune" / "T10-seed0.json"
    # read back as the record every reader reads, with the one entry save adds
    assert store.finished(key, "abc").to_json() == result | {"digest": stored.digest}
    assert store.finished(key, "other") is None
    with pytest.raises(ValueError):
        store.save(key, {"schema_version": 1})


def test_a_run_folder_is_its_safe_label_and_every_name_in_use_is_its_own():
    from pathlib import Path

    from analysis.figures import _file_stem
    from benchmarks.runner.results import safe_label
    from strategies.registry import available

    key = RunKey("my_strategy.strategy:MyStrategy", "synthetic", 5, 0)
    assert key.relpath == Path("synthetic/my_strategy.strategy_MyStrategy/T5-seed0")
    assert str(key) == "my_strategy.strategy:MyStrategy / synthetic / 5 tasks / seed 0"  # a label, not a path
    assert _file_stem(key) == "synthetic_my_strategy.strategy_MyStrategy_T5_seed0"
    assert [safe_label(x) for x in ("a/b", "..", ".hidden", "")] == ["a_b", "_.", "_hidden", "_"]
    labels = set(available()) | {
        label for name in available_suites() for label in load_suite(name).get("variants", {})
    }
    assert labels and all(safe_label(label) == label for label in labels)
    # every stored result keeps its path
    stored = list(iter_results(Path(__file__).resolve().parents[2] / "results"))
    assert stored and all(path.parent.name == safe_label(r["label"]) == r["label"] for path, r in stored)


def test_two_labels_with_one_folder_stop_the_suite_in_one_line(tmp_path):
    from benchmarks.runner.execute import preflight
    from tests.helpers import MINI_SUITE

    path = tmp_path / "clash.toml"
    path.write_text(
        MINI_SUITE.replace('["continual_clip", "finetune"]', '["a:b", "a_b"]')
        + '[variants."a:b"]\nstrategy = "finetune"\n[variants.a_b]\nstrategy = "finetune"\n'
    )
    with pytest.raises(UserError) as error:
        preflight(expand(load_suite(str(path))), "data")
    assert str(error.value) == (
        "runs 'a:b' and 'a_b' would share the result folder 'a_b'; rename one of the variants"
    )


def test_corrupt_result_file_is_a_user_error_naming_the_file(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"schema_version": 1, "stag')
    with pytest.raises(UserError, match=str(path)):
        read_json(path)


def test_iter_results_skips_checkpoints_and_foreign_json(tmp_path):
    (tmp_path / ".checkpoints").mkdir()
    (tmp_path / ".checkpoints" / "state.json").write_text(json.dumps({"schema_version": 1, "stages": []}))
    (tmp_path / "other.json").write_text("[1, 2]")
    stored = Path(__file__).resolve().parents[2] / "results" / "smoke-baselines" / "synthetic" / "clap"
    result = tmp_path / "synthetic" / "clap" / "T10-seed0.json"
    result.parent.mkdir(parents=True)
    result.write_bytes((stored / "T10-seed0.json").read_bytes())
    assert [p for p, _ in iter_results(tmp_path)] == [result]
    # a file that looks like a result but is not a whole one is named, not read
    (tmp_path / "run.json").write_text(json.dumps({"schema_version": 1, "stages": []}))
    skipped: list[str] = []
    assert [p for p, _ in iter_results(tmp_path, skipped)] == [result]
    assert skipped == [
        f"skipped {tmp_path / 'run.json'}: not a complete result (RunResult: missing keys "
        "['strategy', 'label', 'dataset', 'n_tasks', 'seed', 'config', 'class_order', 'tasks', "
        "'summary', 'env', 'cost']); rerun that run with --force, or move the file away"
    ]


def test_every_shipped_suite_resolves_to_valid_strategy_configs():
    from benchmarks.runner.building import resolve

    expected = {
        "smoke",
        "smoke-ablation",
        "smoke-baselines",
        "main",
        "seq",
        "ood",
        "zeroshot",
        "ablation",
        "params",
    }
    assert expected <= set(available_suites())
    for name in available_suites():
        runs = expand(load_suite(name), device="cpu")
        assert runs, name
        for spec in runs:
            resolve(spec, "data")  # unknown options or strategies would raise UserError


def test_smoke_baselines_runs_every_registered_strategy_with_the_smokes_world():
    from strategies.registry import available

    runs = expand(load_suite("smoke-baselines"), device="cpu")
    assert {r.strategy for r in runs} == set(available())
    smoke = {r.label: r for r in expand(load_suite("smoke"), device="cpu")}
    for spec in runs:  # the smoke's rows are the same runs but for its common epoch factor
        if spec.label in smoke and spec.seed == 0:
            scaled = smoke[spec.label].config
            assert {k: v for k, v in scaled.items() if k != "epoch_scale"} == spec.config, spec.label
            assert scaled["epoch_scale"] == load_suite("smoke")["epoch_scale"]


def test_real_suites_mirror_the_paper_protocol():
    main = {(r.label, r.dataset): r for r in expand(load_suite("main"), device="cpu")}
    gr4cil = main[("gr4cil", "cifar100")]
    assert gr4cil.backbone == {"model": "ViT-B-16-quickgelu", "pretrained": "openai"}
    assert gr4cil.strategy_options["epochs"] == 70 and gr4cil.strategy_options["compensation_epochs"] == 3
    assert main[("gr4cil", "imagenet1k")].strategy_options["epochs"] == 10
    assert {r.seed for r in expand(load_suite("main"), device="cpu")} == {0, 1, 2}
    assert {r.n_tasks for r in expand(load_suite("seq"), device="cpu")} == {5, 20}
    peers = {"adaptervlm", "mg_clip", "moe4cl", "magmax"}  # the rows of the paper's Tables 1 and 2 (left)
    for name in ("main", "seq"):
        assert peers <= {r.strategy for r in expand(load_suite(name), device="cpu")}, name
    ood_rows = {
        "continual_clip",
        "moe4cl",
        "adaptervlm",
        "gr4cil",
    }  # Table 2 (right), CODA comes with issue 15
    assert ood_rows <= {r.strategy for r in expand(load_suite("ood"), device="cpu")}
    zeroshot = expand(load_suite("zeroshot"), device="cpu")
    assert all(r.zero_shot_targets == ("pets", "food101", "imagenet1k") for r in zeroshot)
    ablation = {r.label: r.strategy_options for r in expand(load_suite("ablation"), device="cpu")}
    assert ablation["gr4cil-base"]["compensation"] == "off"
    assert ablation["gr4cil-free-random"] == {
        **ablation["gr4cil"],
        "compensation": "unconstrained",
        "compensation_init": "random",
    }


def test_unknown_suite_is_a_user_error_listing_suites():
    with pytest.raises(UserError, match="smoke"):
        load_suite("no-such-suite")


def test_expand_resolves_per_dataset_values_variants_and_filters(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text("""
datasets = ["cifar100", "imagenet100"]
tasks = [10]
seeds = [0, 1]
strategies = ["finetune", "ft-fast"]
device = "cpu"
[defaults]
batch_size = 32
[strategy.finetune]
epochs = { cifar100 = 70, imagenet100 = 10 }
[variants.ft-fast]
strategy = "finetune"
lr = 0.1
""")
    suite = load_suite(str(path))
    runs = expand(suite)
    assert len(runs) == 2 * 2 * 2
    by = {(r.label, r.dataset, r.seed): r for r in runs}
    assert by[("finetune", "cifar100", 0)].strategy_options == {"batch_size": 32, "epochs": 70}
    assert by[("finetune", "imagenet100", 1)].strategy_options["epochs"] == 10
    variant = by[("ft-fast", "cifar100", 0)]
    assert variant.strategy == "finetune" and variant.strategy_options["lr"] == 0.1
    assert variant.strategy_options["epochs"] == 70  # inherits the strategy's options
    assert variant.backbone == {"model": "ViT-B-16-quickgelu", "pretrained": "openai"}
    only = expand(suite, strategies=["finetune"], datasets=["cifar100"], seeds=[5], weights="/w.pt")
    assert [(r.label, r.dataset, r.seed) for r in only] == [("finetune", "cifar100", 5)]
    assert only[0].backbone["pretrained"] == "/w.pt"


def test_missing_per_dataset_value_is_a_user_error(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(
        'datasets = ["food101"]\ntasks = [10]\nseeds = [0]\nstrategies = ["finetune"]\n'
        'device = "cpu"\n[strategy.finetune]\nepochs = { cifar100 = 70 }\n'
    )
    with pytest.raises(UserError, match="food101"):
        expand(load_suite(str(path)))


def _stored_results():
    from pathlib import Path

    return list(iter_results(Path(__file__).resolve().parents[2] / "results"))


def test_every_stored_result_reads_back_equal_through_the_record():
    from benchmarks.runner.result_record import RunCost, RunResult, StageResult

    stored = _stored_results()
    assert len(stored) >= 30
    for path, data in stored:
        record = RunResult.from_json(data)
        assert isinstance(record.cost, RunCost) and all(isinstance(s, StageResult) for s in record.stages)
        assert record.to_json() == data, path
        assert list(record.to_json()) == list(data), path  # the same key order: files rewrite byte-equal
        assert record.key == RunKey(data["label"], data["dataset"], data["n_tasks"], data["seed"])


def test_a_version_1_result_reads_back_equal_and_a_wrong_one_is_named():
    from benchmarks.runner.result_record import RunResult

    _, data = _stored_results()[0]
    version_1 = {k: v for k, v in data.items() if k != "predictions"} | {"schema_version": 1}
    version_1["cost"] = {k: v for k, v in data["cost"].items() if k != "train_steps"} | {
        "peak_memory_kind": "cpu_max_rss"
    }
    assert RunResult.from_json(version_1).to_json() == version_1
    with pytest.raises(ValueError, match=r"RunResult: missing keys \['stages'\]; unknown keys \['stage'\]"):
        RunResult.from_json({k: v for k, v in data.items() if k != "stages"} | {"stage": []})
    with pytest.raises(ValueError, match=r"StageResult: missing keys \['acc'\]"):
        RunResult.from_json(data | {"stages": [{k: v for k, v in data["stages"][0].items() if k != "acc"}]})


def _documented_names(markdown: str, start: str, end: str) -> set[str]:
    """The backticked names that open each table row or bullet between two headings of a doc."""
    import re

    section = markdown[markdown.index(start) : markdown.index(end, markdown.index(start))]
    names = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            names |= set(re.findall(r"`(\w+)`", line.split("|")[1]))
        elif line.startswith("- `"):
            names |= set(re.findall(r"`(\w+)`", line.split(":")[0]))
    return names


def test_the_schema_docs_name_exactly_the_records_fields():
    from dataclasses import fields
    from pathlib import Path

    from benchmarks.runner.result_record import RunCost, RunResult, StageResult

    doc = (Path(__file__).resolve().parents[2] / "docs" / "results-schema.md").read_text()
    for record, start, end in (
        (RunResult, "## The result JSON", "Each stage:"),
        (StageResult, "Each stage:", "**`env`**"),
        (RunCost, "**`cost`**", "**Caching.**"),
    ):
        assert _documented_names(doc, start, end) == {f.name for f in fields(record)}, record.__name__


def test_a_checkpoint_carries_the_progress_and_the_strategys_state(tmp_path):
    import numpy as np
    import torch

    from benchmarks.runner.result_record import RunCost, StageResult
    from benchmarks.runner.results import RunProgress

    store, key = ResultStore(tmp_path), RunKey("finetune", "synthetic", 3, 0)
    stage = StageResult(
        task=1,
        acc=50.0,
        acc_per_task=[50.0],
        n_test_per_task=[4],
        routing_acc=100.0,
        auroc=75.0,
        fpr95=50.0,
        diagnostics={},
    )
    progress = RunProgress([stage], RunCost(train_seconds=1.5, train_steps=7), [np.array([0, 1, 1, 2])])
    store.save_checkpoint(key, progress, {"state/w": torch.ones(2)}, {"seen_classes": [0, 1]}, "h1")
    (loaded, tensors, meta) = store.load_checkpoint(key, "h1")
    assert loaded.stages == [stage] and loaded.cost == progress.cost and loaded.tasks_done == 1
    assert [p.tolist() for p in loaded.predictions] == [[0, 1, 1, 2]]
    assert torch.equal(tensors["state/w"], torch.ones(2)) and meta == {"seen_classes": [0, 1]}
    assert store.load_checkpoint(key, "another config") is None
    progress.stages.append(stage)
    progress.predictions.append(np.array([1, 1, 1, 1]))
    store.save_checkpoint(key, progress, {}, {}, "h1")
    assert sorted(p.name for p in store.checkpoint_dir(key).iterdir()) == [
        "state.json",
        "task-02.safetensors",
    ]
    (tmp_path / ".checkpoints" / key.relpath / "task-02.safetensors").write_bytes(b"cut short")
    with pytest.warns(UserWarning, match="its checkpoint in .* is damaged"):
        assert store.load_checkpoint(key, "h1") is None
    # a state.json that is no checkpoint of ours: started over with the same line, never a traceback
    state = store.checkpoint_dir(key) / "state.json"
    for blob in (b"[]", b'"h1"', b"\xff\xfe", b'{"config_hash": "h1", "tensor_file": 7}'):
        state.write_bytes(blob)
        with pytest.warns(UserWarning, match="its checkpoint in .* is damaged.*starting the run over"):
            assert store.load_checkpoint(key, "h1") is None


def test_where_pixels_are_augmented_is_recorded_and_not_hashed():
    """Both paths give the same pixels (tests/data/test_device_augment.py), so a finished run of one
    serves for the other, and every stored result keeps its hash."""
    device = expand(load_suite("smoke"), device="cpu")
    pil = expand(load_suite("smoke"), device="cpu", augment_on="pil")
    assert {r.augment_on for r in device} == {"device"} and {r.augment_on for r in pil} == {"pil"}
    from benchmarks.runner.building import resolve

    for a, b in zip(device, pil, strict=True):
        recorded_a, recorded_b = resolve(a, "data").config, resolve(b, "data").config  # as results hold them
        assert (recorded_a["augment_on"], recorded_b["augment_on"]) == ("device", "pil")
        assert config_hash(recorded_a) == config_hash(recorded_b)
        assert "augment_on" not in a.config  # one field of the spec, RunSpec.augment_on
    stored = next(iter_results(Path(__file__).parents[2] / "results" / "smoke-baselines"))[1]  # older
    assert "augment_on" not in stored["config"]
    assert config_hash({**stored["config"], "augment_on": "device"}) == config_hash(stored["config"])
