"""The guide's example that trains part of the backbone (``examples/my_strategy/my_strategy/
last_block.py``): the image tower's last block, and only it, learns; its weights travel with the
checkpoints, so a run killed in a task resumes to the same numbers as a run never stopped."""

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
