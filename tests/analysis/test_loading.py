"""One results loader: every reader picks the same result where several files share a run's key,
and reads every stored schema version as typed records."""

import json

import numpy as np
import pytest

from analysis import paired_runs, report, reproducibility, tables
from analysis.orders import Unit
from analysis.paper_inputs import load_inputs
from benchmarks.core.errors import UserError
from benchmarks.runner.reading import read_results
from benchmarks.runner.result_record import RunCost, RunResult, StageResult, config_hash
from benchmarks.runner.results import Predictions, ResultStore, RunKey

KEY = RunKey("gr4cil", "cifar100", 2, 0)
TARGETS = np.array([0, 1, 2, 3])


def _stage(task: int, acc: float) -> StageResult:
    return StageResult(
        task=task,
        acc=acc,
        acc_per_task=[acc] * task,
        n_test_per_task=[2] * task,
        routing_acc=100.0,
        auroc=None,
        fpr95=None,
        diagnostics={},
    )


def _store(root, last_acc: float, zero_shot: dict | None, config: dict | None = None) -> None:
    """A finished 2-task run of KEY whose last accuracy is ``last_acc``, its config ``config``
    beside a marker of that accuracy."""
    result = RunResult(
        schema_version=2,
        strategy=KEY.label,
        label=KEY.label,
        dataset=KEY.dataset,
        n_tasks=KEY.n_tasks,
        seed=KEY.seed,
        config=(config := {"suite_marker": last_acc, **(config or {})}),
        config_hash=config_hash(config),
        class_order=[0, 1, 2, 3],
        class_names=["a", "b", "c", "d"],
        tasks=[[0, 1], [2, 3]],
        stages=[_stage(1, 100.0), _stage(2, last_acc)],
        summary={"avg_acc": (100.0 + last_acc) / 2, "last_acc": last_acc},
        zero_shot=zero_shot,
        env={},
        cost=RunCost(),
    )
    predictions = np.stack([np.array([0, 1, 0, 0]), TARGETS])
    ResultStore(root).save(KEY, result, Predictions(predictions, TARGETS, np.arange(4)))


def _mixed_suites(tmp_path):
    """A main run and a zero-shot run of the same strategy, dataset and seed under one folder, as a
    user who copies both suites' results under ``runs/`` has."""
    runs = tmp_path / "runs"
    _store(runs / "zeroshot", 40.0, {"imagenet": {"zero_shot": 60.0, "n_test": 10}})
    _store(runs / "zeroshot-copy", 40.0, {"imagenet": {"zero_shot": 60.0, "n_test": 10}})  # identical
    _store(runs / "main", 80.0, None)
    return runs


def test_the_rule_prefers_the_run_without_zero_shot_and_counts_copies_once(tmp_path):
    loaded = read_results(_mixed_suites(tmp_path))
    assert len(loaded) == 3 and len(loaded.distinct) == 2
    (chosen,) = loaded.runs
    assert chosen.result.summary["last_acc"] == 80.0 and "main" in chosen.path.parts
    (note,) = loaded.notes
    assert note.startswith("2 results for gr4cil / cifar100 / 2 tasks / seed 0 with different configs; ")
    assert str(chosen.path) in note
    # without the main run, the zero-shot one is used, and its copy counts once
    alone = loaded.where(lambda file: file.result.zero_shot is not None)
    assert [file.result.summary["last_acc"] for file in alone.runs] == [40.0] and alone.notes == []


def test_every_reader_counts_one_seed_in_the_mixed_suites_folder(tmp_path):
    runs = _mixed_suites(tmp_path)
    frame = tables.load_runs(runs, notes=[])
    assert len(frame) == 1 and frame["last_acc"].tolist() == [80.0]
    markdown = tables.write_tables(runs)
    assert "n = 1 seed in every cell" in markdown and "| 90.00 (n = 1) | 80.00 (n = 1) |" in markdown
    assert "Note: 2 results for gr4cil" in markdown

    problems: list[str] = []
    compared = paired_runs.load_runs(runs, problems)
    assert list(compared) == [("cifar100", 2, "gr4cil")]
    assert [run.result.summary["last_acc"] for run in compared["cifar100", 2, "gr4cil"].values()] == [80.0]
    assert sum("2 results for gr4cil" in line for line in problems) == 1

    inputs = load_inputs(runs)
    assert [run.summary["last_acc"] for run in inputs.runs] == [80.0]
    assert len(inputs.all_runs) == 2  # the zero-shot table still finds the zero-shot run


def test_two_suites_results_for_one_run_are_refused_never_chosen_by_path(tmp_path, capsys):
    runs = tmp_path / "runs"
    _store(runs / "suite-a", 80.0, None)
    _store(runs / "suite-b", 70.0, None)
    with pytest.raises(UserError) as refused:
        read_results(runs)
    message = str(refused.value)
    assert message.startswith(f"1 run(s) have results of different configs under {runs}, e.g. {KEY}: ")
    assert str(runs / "suite-a") in message and str(runs / "suite-b") in message
    assert "(they differ in suite_marker)" in message and "--by-suite" in message
    for command in (tables.main, pairing_main):
        assert command(["--results-dir", str(runs)]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0] == f"error: {message}"
    # each suite's folder alone reads as before
    assert [f.result.summary["last_acc"] for f in read_results(runs / "suite-b").runs] == [70.0]


def pairing_main(argv):
    from analysis import compare

    return compare.main([*argv, "--baseline", "gr4cil"])


def test_the_report_by_suite_reads_each_suite_folder_alone(tmp_path, capsys):
    runs, out = tmp_path / "runs", tmp_path / "report"
    _store(runs / "suite-a", 80.0, None)
    _store(runs / "suite-b", 70.0, None)
    (runs / "empty").mkdir()
    assert report.main(["--results-dir", str(runs), "--out", str(out), "--by-suite", "--no-paper"]) == 0
    said = capsys.readouterr()
    assert (
        f"suite suite-a: {runs / 'suite-a'}" in said.err and f"suite suite-b: {runs / 'suite-b'}" in said.err
    )
    assert f"report: {out / 'suite-a' / 'report.md'}" in said.out and not (out / "empty").exists()
    a, b = ((out / name / "report.md").read_text() for name in ("suite-a", "suite-b"))
    # 2-task runs make no paper table; each report's comparison names the one folder it read
    assert f"has runs under {runs / 'suite-a'}:" in a and "suite-b" not in a
    assert f"has runs under {runs / 'suite-b'}:" in b and "suite-a" not in b


def test_fast_dev_runs_never_enter_the_tables_of_real_runs(tmp_path):
    runs = tmp_path / "runs"
    _store(runs / "smoke", 80.0, None)
    _store(runs / "smoke-fast-dev-run", 70.0, None, {"fast_dev_run": {"train_batches": 2}})
    loaded = read_results(runs)
    assert [f.result.summary["last_acc"] for f in loaded.runs] == [80.0]
    (note,) = loaded.notes
    assert note.startswith(f"left out 1 fast-dev-run result(s) (the first: {runs / 'smoke-fast-dev-run'}")
    alone = read_results(runs / "smoke-fast-dev-run")  # read alone, a fast dev run is what there is
    assert [f.result.summary["last_acc"] for f in alone.runs] == [70.0] and alone.notes == []


# ---------------------------------------------------------------- typed records of every schema version
# A 2-task run whose task 1 falls from 100 to 50: forgetting 50, BWT -50.
PER_TASK = [[100.0], [50.0, 100.0]]


def _typed_run(version: int) -> RunResult:
    stages = [
        StageResult(
            task=t,
            acc=float(np.mean(PER_TASK[t - 1])),
            acc_per_task=PER_TASK[t - 1],
            n_test_per_task=[2] * t,
            routing_acc=100.0,
            auroc=60.0 if t == 1 else None,
            fpr95=40.0 if t == 1 else None,
            diagnostics={"routing_acc_full": 99.0},
        )
        for t in (1, 2)
    ]
    summary = {"avg_acc": 87.5, "last_acc": 75.0, "avg_auroc": 60.0, "last_auroc": 60.0}
    if version == 3:
        summary |= {"forgetting": 50.0, "bwt": -50.0}
    return RunResult(
        schema_version=version,
        strategy="gr4cil",
        label=f"v{version}",
        dataset="cifar100",
        n_tasks=2,
        seed=0,
        config=(config := {"strategy_config": {}, "protocol": "one-protocol"}),
        config_hash=config_hash(config),
        class_order=[0, 1, 2, 3],
        class_names=["a", "b", "c", "d"],
        tasks=[[0, 1], [2, 3]],
        stages=stages,
        summary=summary,
        env={},
        # version 1 named the process's resident peak "cpu_max_rss" and counted no training steps
        cost=RunCost(
            train_seconds=1.0,
            eval_seconds=2.0,
            peak_memory_bytes=2**20,
            train_steps=None if version == 1 else 8,
            trainable_params=1000,
            peak_memory_kind="cpu_max_rss" if version == 1 else None,
        ),
    )


@pytest.fixture
def every_version(tmp_path):
    """One run of each readable schema version, as each stored it: version 1 without a predictions
    sidecar, versions 1 and 2 without forgetting and BWT in the summary."""
    predictions = np.stack([np.array([0, 1, 0, 0]), TARGETS])
    for version in (1, 2, 3):
        run = _typed_run(version)
        sidecar = Predictions(predictions, TARGETS, np.arange(4)) if version > 1 else None
        ResultStore(tmp_path).save(run.key, run, sidecar)
    stored = {p.parent.name: json.loads(p.read_text()) for p in sorted(tmp_path.rglob("*.json"))}
    assert {label: data["schema_version"] for label, data in stored.items()} == {"v1": 1, "v2": 2, "v3": 3}
    assert "predictions" not in stored["v1"] and "forgetting" not in stored["v2"]["summary"]
    return tmp_path


def test_every_schema_version_is_read_as_typed_records(every_version):
    results = read_results(every_version)
    assert results.notes == [] and [file.key.label for file in results.runs] == ["v1", "v2", "v3"]
    for file in results.runs:
        run = file.result
        assert isinstance(run, RunResult) and isinstance(run.cost, RunCost)
        assert all(isinstance(stage, StageResult) for stage in run.stages)
        # the fields analysis reads, as typed values: forgetting and BWT computed for versions 1 and 2
        assert (run.summary["forgetting"], run.summary["bwt"]) == (50.0, -50.0)
        assert run.stages[-1].acc_per_task == [50.0, 100.0] and run.stages[-1].routing_acc == 100.0
        assert run.stages[0].diagnostics == {"routing_acc_full": 99.0} and run.tasks == [[0, 1], [2, 3]]
        assert run.cost.trainable_params == 1000 and isinstance(run.cost.peak_memory_bytes, int)
    v1, v2, v3 = (file.result for file in results.runs)
    assert (v1.cost.peak_memory_kind, v1.cost.train_steps, v1.predictions) == ("cpu_max_rss", None, None)
    assert v2.cost.train_steps == 8 and v3.predictions["n_images"] == 4


def test_every_reader_reads_every_schema_version(every_version):
    frame = tables.load_runs(every_version)
    assert frame.set_index("label")[["forgetting", "bwt"]].to_dict("index") == {
        f"v{v}": {"forgetting": 50.0, "bwt": -50.0} for v in (1, 2, 3)
    }
    inputs = load_inputs(every_version)
    assert [run.schema_version for run in inputs.runs] == [1, 2, 3]
    assert all(isinstance(run, RunResult) for run in inputs.runs + inputs.all_runs)
    assert {key.label: path.name for key, path in inputs.paths.items()} == dict.fromkeys(
        ("v1", "v2", "v3"), "T2-seed0.json"
    )
    assert [run.cost.peak_memory_kind for run in inputs.runs] == ["cpu_max_rss", None, None]
    runs = paired_runs.load_runs(every_version, problems := [])
    assert problems == []
    by_label = {label: units[Unit("", 0)] for (_, _, label), units in runs.items()}
    assert by_label["v1"].correct is None and by_label["v2"].correct is not None  # no sidecar in version 1
    assert all(run.stage_accuracy.tolist() == [100.0, 75.0] for run in by_label.values())
    assert "| `gr4cil` |" in reproducibility.reproducibility_markdown(every_version)


def test_a_file_that_is_no_complete_result_is_skipped_with_a_note(every_version):
    broken = every_version / "cifar100" / "v2" / "T2-seed0.json"
    data = json.loads(broken.read_text())
    del data["env"], data["stages"][0]["routing_acc"]
    broken.write_text(json.dumps(data))
    results = read_results(every_version)
    assert [file.key.label for file in results.runs] == ["v1", "v3"]
    (note,) = results.notes
    assert note.startswith(f"skipped {broken}: not a complete result (RunResult: missing keys ['env'])")
    frame = tables.load_runs(every_version, notes=(notes := []))
    assert frame["label"].tolist() == ["v1", "v3"] and notes == [note]
