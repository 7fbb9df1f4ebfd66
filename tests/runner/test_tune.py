"""``python -m benchmarks.tune``: Optuna trials run by the runner on a validation split that never
read a test image, a killed tune that resumes without recomputing a finished trial, the tuned suite
that the runner then scores on the test set, and one line for each mistake in the space or budget."""

from __future__ import annotations

import dataclasses
import tomllib

import optuna
import pytest
from torch.utils.data import Dataset

from benchmarks import run, tune
from benchmarks.runner import building
from benchmarks.runner.reading import iter_results
from strategies.registry import get_strategy
from tests.helpers import kill_in_task, tiny_suite

SUITE = (
    tiny_suite(["continual_clip", "finetune"], tasks=3)
    + """[dataset.synthetic]
n_classes = 15
n_train_per_class = 8
n_test_per_class = 4
[defaults]
batch_size = 16
[strategy.finetune]
epochs = 1
"""
)
SPACE = """[finetune]
lr = {low = 1e-4, high = 1e-2, log = true}
"""


class _NoTestImage(Dataset):
    def __len__(self):
        return 60

    def __getitem__(self, index):
        raise AssertionError("the tune read a test image")


def _files(tmp_path, space: str = SPACE):
    (tmp_path / "suite.toml").write_text(SUITE)
    (tmp_path / "space.toml").write_text(space)
    return tmp_path / "suite.toml", tmp_path / "space.toml", tmp_path / "tune"


def _argv(suite, space, results, *extra):
    return ["--suite", str(suite), "--strategies", "finetune", "--space", str(space), "--trials", "2",
            "--results-dir", str(results), "--data-root", str(results.parent), "--quiet", *extra]  # fmt: skip


def _study(results):
    storage = f"sqlite:///{results / 'optuna.sqlite3'}"
    return optuna.load_study(study_name="suite-finetune-val_avg", storage=storage)


def test_a_tune_never_reads_a_test_image_and_its_suite_runs_on_the_test_set(tmp_path, monkeypatch):
    suite, space, results = _files(tmp_path)
    real = building.load_run_data
    monkeypatch.setattr(
        building,
        "load_run_data",
        lambda spec, root: dataclasses.replace(real(spec, root), test=_NoTestImage()),
    )
    assert tune.main(_argv(suite, space, results)) == 0
    trials = _study(results).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    for _, result in iter_results(results / "trials"):  # each trial's run: validation only
        assert result["config"]["evaluate_test"] is False
        assert result["config"]["validation"] == {"fraction": 0.1, "seed": 0}
    tuned = tomllib.loads((results / "tuned.toml").read_text())
    best = max(trials, key=lambda t: t.value)
    assert tuned["strategies"] == ["finetune", "finetune-tuned"]
    assert tuned["variants"]["finetune-tuned"] == {"strategy": "finetune", "lr": best.params["lr"]}
    provenance = tuned["tuned"]["finetune-tuned"]
    assert provenance["trials"] == 2 and provenance["objective"] == "val_avg"
    assert provenance["space"] == {"lr": {"low": 1e-4, "high": 1e-2, "log": True}}
    assert [row["value"] for row in provenance["trial_table"]] == [t.value for t in trials]
    assert "validation_fraction" not in tuned and "evaluate_test" not in tuned

    monkeypatch.setattr(building, "load_run_data", real)  # the tuned suite is scored on the test set
    argv = ["--suite", str(results / "tuned.toml"), "--results-dir", str(tmp_path / "test"), "--quiet"]
    assert run.main([*argv, "--strategies", "finetune-tuned", "--data-root", str(tmp_path)]) == 0
    ((_, result),) = list(iter_results(tmp_path / "test"))
    assert result["config"]["tuned"]["study"] == "suite-finetune-val_avg"
    assert result["config"]["strategy_config"]["lr"] == best.params["lr"]
    assert "validation" not in result["config"]


def test_a_killed_tune_resumes_and_never_recomputes_a_finished_trial(tmp_path, monkeypatch):
    suite, space, results = _files(tmp_path)
    finetune = get_strategy("finetune")
    revive = kill_in_task(monkeypatch, finetune, task=5)  # the second trial's second task
    assert tune.main(_argv(suite, space, results)) == 130
    revive()
    killed = _study(results).trials
    assert [t.state.name for t in killed] == ["COMPLETE", "FAIL"]
    learned = []
    real_learn = finetune.learn
    monkeypatch.setattr(finetune, "learn", lambda self, e: (learned.append(1), real_learn(self, e))[1])
    argv = _argv(suite, space, results)
    argv[argv.index("--trials") + 1] = "3"  # and one trial more, sampled in the resumed process
    assert tune.main(argv) == 0
    # the killed trial's tasks 2 and 3 (its task 1 and the first trial are kept), then the new trial's 3
    assert len(learned) == 2 + 3
    trials = _study(results).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]
    assert trials[2].params == killed[1].params  # asked again with the killed trial's values
    assert trials[3].params != trials[0].params  # a resumed sampler does not draw the first values again
    assert (results / "tuned.toml").is_file()


@pytest.mark.parametrize(
    "space, extra, says",
    [
        ("[finetune]\nlearning_rate = {low = 0.1, high = 1.0}\n", (), "Config has no field 'learning_rate'"),
        ('[finetune]\nlr = {low = "small", high = 1.0}\n', (), "a range needs numbers on a numeric field"),
        ("[finetune]\nepochs = {low = 0.5, high = 3}\n", (), "epochs is a whole number"),
        ("[finetune]\ntrain_augmentation = {low = 1, high = 2}\n", (), "a range needs numbers"),
        ("[finetune]\nlr = {low = 0.1, high = 0.01}\n", (), "needs low < high"),
        ("[gr4cil]\nlr = {low = 0.1, high = 1.0}\n", (), "has table(s) ['gr4cil'] for no row of the suite"),
        ("[continual_clip]\nlr = {low = 0.1, high = 1.0}\n", (), "has no [finetune] table"),
        (SPACE, ("--trials", "0"), "a trial budget is a whole number >= 1"),
    ],
)
def test_a_mistake_in_the_space_or_the_budget_is_one_line(tmp_path, capsys, space, extra, says):
    suite, space_file, results = _files(tmp_path, space)
    with pytest.raises(SystemExit) if extra else _no_exit() as exit_code:
        code = tune.main(_argv(suite, space_file, results, *extra))
        assert code == 2
    if extra:
        assert exit_code.value.code == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1
    assert not (results / "optuna.sqlite3").exists()  # refused before any study or trial


class _no_exit:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def test_one_command_tunes_several_strategies_each_with_the_same_budget(tmp_path):
    suite, space, results = _files(
        tmp_path,
        SPACE
        + "[continual_clip]\nprompt_template = {choices = ['a photo of a {}.', 'a bad photo of a {}.']}\n",
    )
    argv = _argv(suite, space, results)
    argv[argv.index("finetune")] = "finetune,continual_clip"
    argv[argv.index("--trials") + 1] = "1"
    assert tune.main(argv) == 0
    storage = f"sqlite:///{results / 'optuna.sqlite3'}"
    for label in ("finetune", "continual_clip"):
        study = optuna.load_study(study_name=f"suite-{label}-val_avg", storage=storage)
        assert [t.state.name for t in study.trials] == ["COMPLETE"]
    tuned = tomllib.loads((results / "tuned.toml").read_text())
    assert tuned["strategies"] == ["finetune", "finetune-tuned", "continual_clip", "continual_clip-tuned"]
    assert {p["trials"] for p in tuned["tuned"].values()} == {1}


def _first_draws(sampler) -> tuple[float, float]:
    """The values ``sampler`` draws first, in GR4CIL's space of examples/tuning (lr, weight_decay)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trial = optuna.create_study(sampler=sampler).ask()
    return trial.suggest_float("lr", 1e-3, 2e-2, log=True), trial.suggest_float("weight_decay", 0.0, 0.3)


def test_each_trial_draws_from_its_own_well_mixed_seed():
    """Trial n's sampler is seeded from (seed, n), never seed + n: NumPy's generators seeded 0 and 3
    start alike, and a study seeded so drew its trials 0 and 3 within 1 % of each other."""
    from benchmarks.tune_study import _sampler

    draws = [_first_draws(_sampler(0, n)) for n in range(8)]
    assert draws[0] == _first_draws(_sampler(0, 0))  # reproducible
    for a in range(8):
        for b in range(a + 1, 8):
            close = [abs(x - y) <= 0.02 * max(abs(x), abs(y)) for x, y in zip(draws[a], draws[b])]
            assert not all(close), (a, b, draws[a], draws[b])
    # what seed + n drew: trials 0 and 3 alike (the check above fails on it)
    plain = [_first_draws(optuna.samplers.TPESampler(seed=n)) for n in (0, 3)]
    assert all(abs(x - y) <= 0.02 * x for x, y in zip(*plain))
