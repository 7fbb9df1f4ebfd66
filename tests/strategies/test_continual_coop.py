"""The continual-CoOp example (``examples/continual_coop``): a learnable text context through
``CLIPBackbone.text_context``. Initialised to the template's own words it is zero-shot CLIP; it
moves in training; a run killed after a task resumes to the same numbers."""

import sys
from pathlib import Path

import pytest
import torch

from benchmarks.core.environment import seed_everything
from tests.helpers import check_save_load_and_resume, run_one_run_suite, strategy_and_stream, three_task_suite

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "continual_coop"
LABEL = "continual_coop.strategy:ContinualCoOp"


@pytest.fixture(autouse=True)
def _example_on_the_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    yield
    sys.modules.pop("continual_coop.strategy", None)
    sys.modules.pop("continual_coop", None)


def test_the_template_initialised_context_scores_as_zero_shot_clip(tmp_path):
    for folder in ("coop", "clip"):
        (tmp_path / folder).mkdir()
    coop, stream = strategy_and_stream(tmp_path / "coop", three_task_suite(LABEL, ""))
    clip, _ = strategy_and_stream(tmp_path / "clip", three_task_suite("continual_clip", "epochs = 0"))
    for strategy in (coop, clip):
        strategy.seen_classes = list(range(15))  # every class, in strategy_and_stream's order
    images = torch.stack([stream.test_set[i][0] for i in range(0, 60, 7)])
    torch.testing.assert_close(coop.scores(images), clip.scores(images), rtol=0, atol=1e-6)
    torch.testing.assert_close(
        coop.evaluate_dataset(stream.test_set), clip.evaluate_dataset(stream.test_set), rtol=0, atol=1e-6
    )


def test_the_context_moves_in_training_and_only_it_is_counted(tmp_path):
    coop, stream = strategy_and_stream(tmp_path, three_task_suite(LABEL, "epochs = 1"))
    start = coop.context.detach().clone()
    seed_everything(0, 0)
    coop.learn(stream.train_stream[0])
    assert isinstance(coop.context, torch.nn.Parameter) and coop.context.requires_grad
    assert (coop.context.detach() - start).norm() > 1e-4
    assert coop.trainable_parameter_count() == coop.context.numel() == 4 * 64
    assert set(coop.optimized_parameters) == {"context"}


def test_a_killed_run_resumes_to_the_same_numbers(tmp_path, monkeypatch):
    from continual_coop.strategy import ContinualCoOp

    run = run_one_run_suite(tmp_path, three_task_suite(LABEL, "epochs = 1"), "--save-models")
    _, _, result = run
    assert result["cost"]["trainable_params"] == 4 * 64
    loaded = check_save_load_and_resume(run, ContinualCoOp, tmp_path, monkeypatch)
    assert isinstance(loaded.context, torch.nn.Parameter)  # restored in place: it would train on


def test_a_template_that_does_not_start_with_the_context_is_one_line(tmp_path):
    from benchmarks.core.errors import UserError

    with pytest.raises(UserError, match="must start with context_init 'a photo of a'"):
        strategy_and_stream(tmp_path, three_task_suite(LABEL, 'prompt_template = "itap of a {}."'))
