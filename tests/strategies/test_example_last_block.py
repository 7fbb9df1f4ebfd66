"""The guide's example that trains part of the backbone (``examples/my_strategy/my_strategy/
last_block.py``): the image tower's last block, and only it, learns; its weights travel with the
checkpoints, so a run killed in a task resumes to the same numbers as a run never stopped."""

import tomllib
from pathlib import Path

import pytest

from benchmarks import run
from benchmarks.backbone import BackboneSpec, create_clip
from benchmarks.runner.reading import iter_results
from tests.helpers import kill_in_task, three_task_suite

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "my_strategy"
LABEL = "my_strategy.last_block:LastBlock"


@pytest.fixture
def last_block(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))  # as PYTHONPATH=examples/my_strategy does
    from my_strategy.last_block import LastBlock

    return LastBlock


def _suite(tmp_path) -> Path:
    suite = tmp_path / "suite.toml"
    text = three_task_suite("finetune", "")  # finetune's table stays unused: the label runs alone
    suite.write_text(text + f'[strategy."{LABEL}"]\nepochs = 2\nlr = 1e-3\n')
    return suite


def _run(suite: Path, results: Path, strategy: str = LABEL) -> int:
    return run.main(
        ["--suite", str(suite), "--strategies", strategy, "--results-dir", str(results), "--quiet"]
    )


@pytest.mark.slow
def test_only_the_last_block_learns_and_a_killed_run_resumes_to_the_same_numbers(
    tmp_path, last_block, monkeypatch
):
    suite = _suite(tmp_path)
    assert _run(suite, tmp_path / "straight") == 0
    ((_, straight),) = list(iter_results(tmp_path / "straight"))

    tower = create_clip(BackboneSpec("tiny-clip-32", "synthetic"), device="cpu").model.visual
    block = sum(p.numel() for p in tower.transformer.resblocks[-1].parameters())
    assert straight["cost"]["trainable_params"] == block  # the block, and nothing else
    assert _run(suite, tmp_path / "zero-shot", "continual_clip") == 0
    ((_, zero_shot),) = list(iter_results(tmp_path / "zero-shot"))
    assert straight["stages"][0]["acc"] != zero_shot["stages"][0]["acc"]  # the block moved CLIP

    # killed as task 2 starts: the rerun builds a fresh backbone, so only the checkpoint's
    # last_block can bring back what task 1 taught the block
    revive = kill_in_task(monkeypatch, last_block, task=2)
    assert _run(suite, tmp_path / "resumed") == 130
    revive()
    assert _run(suite, tmp_path / "resumed") == 0
    ((_, resumed),) = list(iter_results(tmp_path / "resumed"))
    assert [stage["acc_per_task"] for stage in resumed["stages"]] == [
        stage["acc_per_task"] for stage in straight["stages"]
    ]


def test_the_guides_quick_start_shows_the_example_as_it_is():
    guide = (EXAMPLE.parents[1] / "docs" / "adding-a-strategy.md").read_text()
    shown = guide[guide.index("```python\n") + len("```python\n") :]
    shown = shown[: shown.index("```")]
    code = (EXAMPLE / "my_strategy" / "last_block.py").read_text()
    assert shown == code[code.index("@dataclass\n") :]


@pytest.mark.slow
def test_the_example_and_gr4cil_are_tuned_with_one_budget_and_compared_on_the_test_set(
    tmp_path, last_block, capsys
):
    """The guide's three commands: both tuned on a validation split with the same budget, the tuned
    suite run on the test set, the tuned rows compared and marked as tuned."""
    from analysis import compare
    from benchmarks import tune

    suite, tuned_dir = _suite(tmp_path), tmp_path / "tune"
    suite.write_text(suite.read_text() + "[strategy.gr4cil]\nepochs = 1\ncompensation_epochs = 1\n")
    argv = ["--suite", str(suite), "--strategies", f"gr4cil,{LABEL}", "--trials", "2", "--seeds", "0"]
    space = EXAMPLE / "space.toml"
    assert tune.main([*argv, "--space", str(space), "--results-dir", str(tuned_dir), "--quiet"]) == 0

    tuned = tomllib.loads((tuned_dir / "tuned.toml").read_text())
    assert tuned["strategies"] == ["gr4cil", "gr4cil-tuned", LABEL, f"{LABEL}-tuned"]
    assert tuned["variants"][f"{LABEL}-tuned"]["strategy"] == LABEL
    assert {t["trials"] for t in tuned["tuned"].values()} == {2}  # the same budget each
    assert set(tuned["tuned"][f"{LABEL}-tuned"]["space"]) == {"lr"}
    assert set(tuned["tuned"]["gr4cil-tuned"]["space"]) == {"lr", "weight_decay"}

    test_dir = tmp_path / "test"
    assert (
        run.main(["--suite", str(tuned_dir / "tuned.toml"), "--results-dir", str(test_dir), "--quiet"]) == 0
    )
    results = {r["label"]: r for _, r in iter_results(test_dir)}
    assert sorted(results) == sorted(tuned["strategies"])
    assert results[f"{LABEL}-tuned"]["config"]["tuned"]["trials"] == 2
    assert "tuned" not in results[LABEL]["config"]
    capsys.readouterr()
    assert (
        compare.main(["--results-dir", str(test_dir), "--baseline", "gr4cil-tuned", "--metric", "last"]) == 0
    )
    out = capsys.readouterr().out
    assert f"| {LABEL}-tuned | synthetic | 3 |" in out and "Not a ranking" in out
    noted = {line.split(" on synthetic")[0][2:] for line in out.splitlines() if "is a tuned row" in line}
    # the untuned example set against the tuned GR4CIL says so; the two tuned rows need no note
    assert noted == {"gr4cil", LABEL} and "gr4cil-tuned is a tuned row" in out
