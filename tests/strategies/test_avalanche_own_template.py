"""A user's own SupervisedTemplate subclass (examples/avalanche_own) through the runner as
``avalanche:module:Class``: its options come from its signature, and it learns."""

from pathlib import Path

import pytest

from strategies.registry import get_strategy
from tests.helpers import run_one_run_suite, three_task_suite

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "avalanche_own"
NAME = "avalanche:avalanche_own.template:SeenClassesOnly"


@pytest.mark.slow
def test_a_users_template_runs_through_the_runner(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    config = get_strategy(NAME).Config
    assert config.__dataclass_fields__["smoothing"].default == 0.1  # its own signature's default
    options = "batch_size = 16\neval_batch_size = 64\nepochs = 2\nlr = 0.01\nsmoothing = 0.2\n"
    *_, result = run_one_run_suite(tmp_path, three_task_suite(NAME, options))
    assert result["config"]["strategy_config"]["smoothing"] == 0.2
    assert result["label"] == NAME and len(result["stages"]) == 3
    assert result["stages"][0]["acc"] > 100 / 5  # above chance on the first task's 5 classes
