"""Several ``python -m benchmarks.tune`` workers on one study (the same ``--storage`` and results
folder): local processes started together, as a user starts them by hand, run the budget exactly
once between them, each trial with values of its own; ``test_slurm_real.py`` does the same as a
SLURM job array. A plugin (``tests/runner/rendezvous.py``) holds each worker's first trial until the
other's has started, so the workers certainly run at once."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import optuna
import pytest

from benchmarks.runner.reading import iter_results
from tests.runner.test_tune import SPACE, SUITE

pytestmark = pytest.mark.slow

TRIALS = 3  # odd: two workers in step would start a fourth under a rule of "fewer than 3 finished"


def shared_tune(tmp_path) -> tuple[list[str], object]:
    """The command line every worker runs, and the folder they share."""
    suite = SUITE.replace(
        "batch_size = 16\n",
        'batch_size = 16\nplugins = { "tests.runner.rendezvous:Rendezvous" = '
        f'{{ folder = "{tmp_path / "met"}" }} }}\n',
    )
    (tmp_path / "suite.toml").write_text(suite)
    (tmp_path / "space.toml").write_text(SPACE)
    results = tmp_path / "tune"
    argv = [sys.executable, "-m", "benchmarks.tune", "--suite", str(tmp_path / "suite.toml"),
            "--strategies", "finetune", "--space", str(tmp_path / "space.toml"), "--trials", str(TRIALS),
            "--results-dir", str(results), "--data-root", str(tmp_path)]  # fmt: skip
    return argv, results


def study_trials(results) -> list:
    storage = f"sqlite:///{results / 'optuna.sqlite3'}"
    return optuna.load_study(study_name="suite-finetune-val_avg", storage=storage).trials


def check_shared_study(results, workers: int) -> None:
    """The budget ran exactly once between ``workers`` processes, each trial with its own values,
    each trial's runs computed once, and the tuned suite written."""
    trials = study_trials(results)
    assert [t.state.name for t in trials] == ["COMPLETE"] * TRIALS  # not a trial over the budget
    assert len({t.params["lr"] for t in trials}) == TRIALS  # workers that start together draw apart
    assert len({t.user_attrs["worker"] for t in trials}) == workers
    for trial in trials:  # each trial's run, stored once in its own folder
        folder = Path(trial.user_attrs["folder"])
        assert [p.relative_to(folder).as_posix() for p, _ in iter_results(folder)] == [
            "synthetic/finetune/T3-seed0.json"
        ]
    tuned = tomllib.loads((results / "tuned.toml").read_text())
    best = max(trials, key=lambda t: t.value)
    assert tuned["variants"]["finetune-tuned"]["lr"] == best.params["lr"]
    assert tuned["tuned"]["finetune-tuned"]["trials"] == TRIALS


def test_two_local_workers_share_one_study_and_its_budget(tmp_path):
    argv, results = shared_tune(tmp_path)
    workers = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    outputs = [worker.communicate(timeout=600) for worker in workers]
    for worker, (out, err) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, err
        assert "finetune: best val_avg" in out
    check_shared_study(results, workers=2)
