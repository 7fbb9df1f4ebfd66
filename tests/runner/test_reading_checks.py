"""Every reader checks what it reads, whatever the file's schema version (issue 63): the summary
against its stages, the file's place against the run it holds, the config against its hash. A file
that fails is named with why and left out of the tables, and every bad file of a folder is named
in one pass. The files are copies of the committed smoke results, edited as a user might."""

import json
import shutil
from pathlib import Path

import pytest

from analysis.tables import main as tables_main
from benchmarks.runner import status
from benchmarks.runner.reading import read_results
from benchmarks.runner.result_record import stored_key, summary_disagreement
from benchmarks.runner.results import ResultStore

STORED = Path(__file__).resolve().parents[2] / "results" / "smoke-baselines" / "synthetic"
CLAP = Path("synthetic", "clap", "T10-seed0.json")


@pytest.fixture
def results(tmp_path) -> Path:
    """A results folder holding the committed smoke results of CLAP and fine-tuning (6 runs)."""
    for method in ("clap", "finetune"):
        shutil.copytree(STORED / method, tmp_path / "synthetic" / method)
    return tmp_path


def _edit(path: Path, change) -> dict:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return data


def _summary_99(data):
    data["summary"]["last_acc"] = 99.0


EDITS = {
    "summary, digest removed": (lambda d: (d.pop("digest"), _summary_99(d)), "its summary's last_acc 99.0"),
    "summary, as version 3": (
        lambda d: (d.update(schema_version=3), _summary_99(d)),
        "its summary's last_acc 99.0 disagrees with its stages (26.05)",
    ),
    "summary, as version 1": (
        lambda d: (d.update(schema_version=1), d.pop("digest"), _summary_99(d)),
        "its summary's last_acc 99.0 disagrees with its stages (26.05)",
    ),
    "config, hash left": (
        lambda d: d["config"]["strategy_config"].update(epochs=99),
        "its config changed after the run wrote it (its config_hash is",
    ),
    "config, as version 3": (
        lambda d: (d.update(schema_version=3), d.pop("digest"), d["config"].update(precision="fp16")),
        "its config changed after the run wrote it",
    ),
    "label": (
        lambda d: d.update(label="clap-tuned"),
        "it holds the run clap-tuned / synthetic / 10 tasks / seed 0, whose place is "
        "synthetic/clap-tuned/T10-seed0.json: it was moved or edited by hand",
    ),
    "seed": (lambda d: d.update(seed=7), "whose place is synthetic/clap/T10-seed7.json"),
    # what RunResult cannot read is no result for the runner either (it once counted as finished)
    "a key missing": (lambda d: d.pop("env"), "not a complete result (RunResult: missing keys ['env'])"),
    "a key unknown": (
        lambda d: d.update(note="mine"),
        "not a complete result (RunResult: unknown keys ['note'])",
    ),
}


@pytest.mark.parametrize("edit", EDITS)
def test_a_hand_edit_of_any_version_is_named_left_out_and_never_cached(results, edit):
    change, why = EDITS[edit]
    path = results / CLAP
    original = json.loads(path.read_text())
    _edit(path, change)

    loaded = read_results(results)
    (line,) = loaded.skipped
    assert line.startswith(f"skipped {path}: ") and why in line, line
    assert len(loaded.runs) == 5 and path not in [file.path for file in loaded.runs]

    # the runner neither calls it finished nor replaces it unasked, and --force may replace it
    store, key = ResultStore(results), stored_key(original)
    assert store.finished(key, original["config_hash"]) is None
    refused = store.refusal(key, original["config_hash"])
    assert refused is not None and refused.startswith(f"result file {path}: ") and why in refused
    assert store.refusal(key, original["config_hash"], force=True) is None


def test_the_unedited_copies_of_every_version_are_read_without_a_word(results):
    """The control: the checks pass the runner's own files, of each version (fine-tuning's were
    written as version 2, CLAP's as 5)."""
    _edit(results / "synthetic" / "finetune" / "T10-seed1.json", lambda d: d.update(schema_version=1))
    _edit(results / "synthetic" / "clap" / "T10-seed1.json", lambda d: d.update(schema_version=4))
    _edit(
        results / "synthetic" / "clap" / "T10-seed2.json",
        lambda d: (d.update(schema_version=3), d.pop("digest")),
    )
    loaded = read_results(results)
    assert loaded.skipped == () and len(loaded.runs) == 6
    versions = sorted(file.result.schema_version for file in loaded.runs)
    assert versions == [1, 2, 2, 3, 4, 5]


def test_every_bad_file_of_a_folder_is_named_in_one_pass(results, capsys):
    bad = sorted((results / "synthetic").rglob("T10-seed[01].json"))  # 4 of the 6
    bad[0].write_text(bad[0].read_text()[:200])  # truncated
    bad[1].write_bytes(b"\xff\xfe not UTF-8")
    _edit(bad[2], _summary_99)
    _edit(bad[3], lambda d: d.update(label="moved"))

    skipped = read_results(results).skipped
    assert len(skipped) == 4 and all(str(path) in line for path, line in zip(bad, skipped)), skipped

    assert tables_main(["--results-dir", str(results)]) == 0  # the two good runs are tabled
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Note: skipped")]
    assert len(notes) == 4 and all(str(path) in note for path, note in zip(bad, notes))

    assert status.main(["--results-dir", str(results)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "| refused |" in line]
    assert sorted(row.split("result file ")[1].split()[0].rstrip(":") for row in rows) == sorted(
        map(str, bad)
    )


def test_a_validation_summary_is_checked_against_the_stages_validation_metrics():
    stages = [
        {"acc": 80.0, "auroc": 70.0, "acc_per_task": [80.0], "validation": None},
        {"acc": 60.0, "auroc": None, "acc_per_task": [50.0, 70.0], "validation": None},
    ]
    validation = [
        {"acc": 90.0, "auroc": 75.0, "acc_per_task": [90.0]},
        {"acc": 70.0, "auroc": None, "acc_per_task": [60.0, 80.0]},
    ]
    # by hand: avg (90 + 70) / 2 = 80, last 70, forgetting 90 - 60 = 30
    stages = [{**stage, "validation": v} for stage, v in zip(stages, validation)]
    data = {"stages": stages, "summary": {"avg_acc": 70.0, "last_acc": 60.0}}
    good = {"avg_acc": 80.0, "last_acc": 70.0, "forgetting": 30.0}
    assert summary_disagreement({**data, "validation_summary": good}) is None
    edited = {**good, "forgetting": 3.0}
    assert summary_disagreement({**data, "validation_summary": edited}) == (
        "its validation summary's forgetting 3.0 disagrees with its stages (30.0)"
    )
    # the test summary is checked first, with the same words
    assert summary_disagreement({**data, "summary": {"avg_acc": 71.0}}) == (
        "its summary's avg_acc 71.0 disagrees with its stages (70.0)"
    )


def test_damaged_checkpoint_error_and_queued_records_are_read_as_none_by_status(results, capsys):
    """A checkpoint state, an error record and a queued mark that are no object of their fields:
    status shows each run, as if the record were absent, without a traceback."""
    for seed, folder, name, content in (
        (9, ".checkpoints", "T10-seed9/state.json", "[]"),
        (8, ".locks", "T10-seed8.error", '"x"'),
        (7, ".locks", "T10-seed7.queued", '{"job_id": 1, "submitted": "yesterday"}'),
    ):
        path = results / folder / "synthetic" / "clap" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    assert status.main(["--results-dir", str(results)]) == 0
    rows = {line.split(" | ")[0]: line for line in capsys.readouterr().out.splitlines() if "clap" in line}
    for seed in (7, 8, 9):
        assert "| to run |" in rows[f"| clap / synthetic / 10 tasks / seed {seed}"]
