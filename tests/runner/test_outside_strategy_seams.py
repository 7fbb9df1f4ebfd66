"""Where the runner meets a strategy from outside the suite (neither ``CLIPStrategy`` nor an
adapter): it reads only the contract's members (``strategies.contract``), with the contract's
defaults for the optional ones, scores zero-shot targets through ``ZeroShotStrategy`` alone, and
says in one line what it cannot hand such a strategy (the live log's training iterations, plugins)."""

import csv
from pathlib import Path

import pytest

from benchmarks import run
from benchmarks.core.errors import UserError
from benchmarks.data.streams import spread_indices
from benchmarks.runner.limits import RunLimits
from benchmarks.runner.reading import iter_results
from benchmarks.runner.zero_shot import zero_shot_accuracy, zero_shot_target
from strategies.config import StrategyConfig
from strategies.settings import RunSettings
from tests.helpers import tiny_suite

REPO = Path(__file__).resolve().parents[2]

MODULE = '''
import torch


class FirstSeen:
    """The contract's required members and the two zero-shot methods: nothing else (it keeps no
    backbone, only the image size it expects)."""

    def __init__(self, *, backbone, **runner_arguments):
        self.image_size = backbone.image_size
        self.seen_classes = []

    def learn(self, experience):
        self.seen_classes += [int(c) for c in experience.classes_in_this_experience]

    def scores(self, images):  # every image as the first class seen
        scores = torch.zeros(len(images), len(self.seen_classes))
        scores[:, 0] = 1.0
        return scores

    def checkpoint_state(self):
        return {}, {"seen_classes": self.seen_classes}

    def load_checkpoint_state(self, tensors, meta):
        self.seen_classes = list(meta["seen_classes"])

    def zero_shot_text(self, tokens):
        return len(tokens)  # one prompt a class

    def zero_shot_predictions(self, images, text):
        size = self.image_size
        assert images.dtype == torch.float32 and images.shape[1:] == (3, size, size)
        first = torch.zeros(len(images), dtype=torch.long, device=images.device)
        return {"first": first, "last": first + text - 1, "unknown": first.bool()}
'''


@pytest.fixture
def outside_module(tmp_path, monkeypatch):
    (tmp_path / "outside_seams.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "outside_seams"


@pytest.fixture(scope="module")
def tiny_backbone():
    from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip

    return create_clip(BackboneSpec(TINY_MODEL, "synthetic"))


def _expected(target: str, limit: int | None = None) -> dict:
    """What ``FirstSeen`` scores on ``target``'s test split (``limit`` images of it, spread)."""
    data = zero_shot_target(target, "data")
    targets = data.test_targets
    if limit is not None:
        every_class = {c: 0 for c in range(len(data.class_names))}
        targets = [targets[i] for i in spread_indices(targets, every_class, limit=limit)]
    last = len(data.class_names) - 1
    return {
        "first": 100.0 * targets.count(0) / len(targets),
        "last": 100.0 * targets.count(last) / len(targets),
        "unknown_rate": 0.0,
        "n_test": len(targets),
    }


def test_an_outside_zero_shot_strategy_is_scored_through_the_protocol_alone(outside_module, tiny_backbone):
    import importlib

    strategy = importlib.import_module(outside_module).FirstSeen(backbone=tiny_backbone)
    config = StrategyConfig(eval_batch_size=7)  # batches of every size but the last
    score = zero_shot_accuracy
    got = score(strategy, tiny_backbone, "synthetic", "data", limits=RunLimits(), config=config, device="cpu")
    assert got == _expected("synthetic")
    limits = RunLimits(zero_shot_images=10)
    limited = score(strategy, tiny_backbone, "synthetic", "data", limits=limits, config=config, device="cpu")
    assert limited == _expected("synthetic", limit=10)
    # the first 4 classes only, candidates and images: 10 images spread over them are 3, 3, 2, 2 (by
    # hand: a round of every class before a second image of any), and "last" is class 3
    limits = RunLimits(zero_shot_images=10, zero_shot_classes=4)
    limited = score(strategy, tiny_backbone, "synthetic", "data", limits=limits, config=config, device="cpu")
    assert limited == {"first": 30.0, "last": 20.0, "unknown_rate": 0.0, "n_test": 10}


def test_a_strategy_without_zero_shot_text_is_one_line_for_a_zero_shot_target(outside_module, tiny_backbone):
    import importlib
    from types import SimpleNamespace

    from strategies.contract import REQUIRED

    full = importlib.import_module(outside_module).FirstSeen(backbone=tiny_backbone)
    strategy = SimpleNamespace(**{name: getattr(full, name) for name in [*REQUIRED, "zero_shot_predictions"]})
    with pytest.raises(UserError) as err:
        zero_shot_accuracy(
            strategy,
            tiny_backbone,
            "synthetic",
            "data",
            limits=RunLimits(),
            config=StrategyConfig(),
            device="cpu",
        )
    message = str(err.value)
    assert "\n" not in message and "it needs zero_shot_text and zero_shot_predictions" in message


@pytest.mark.slow
def test_the_runner_runs_an_outside_strategy_with_defaults_zero_shot_and_a_warned_live_log(
    outside_module, tmp_path
):
    suite = tmp_path / "outside.toml"
    suite.write_text(
        tiny_suite([f"{outside_module}:FirstSeen"], tasks=2, zero_shot_targets=["synthetic"])
        + "[dataset.synthetic]\nn_classes = 4\nn_train_per_class = 2\nn_test_per_class = 2\n"
    )
    results = tmp_path / "results"
    argv = ["--suite", str(suite), "--results-dir", str(results), "--log", "csv", "--quiet"]
    with pytest.warns(UserWarning) as warned:
        assert run.main(argv) == 0
    (result,) = [r for _, r in iter_results(results)]
    # the contract's defaults stand in for every optional member it lacks
    assert [stage["diagnostics"] for stage in result["stages"]] == [{}, {}]
    assert result["diagnostics"] == {}
    cost = result["cost"]
    assert cost.get("train_steps") is None and cost.get("trainable_params") is None  # null: left out
    assert cost["amp_skipped_steps"] == 0
    assert result["zero_shot"] == {"synthetic": _expected("synthetic")}
    # its live log holds the stages, no training iteration, and the run says so once, in one line
    said = [str(w.message) for w in warned if "does not run Avalanche's loop" in str(w.message)]
    assert len(said) == 1 and "\n" not in said[0]
    assert said[0].endswith("its live log (--log) holds its stages, not its training iterations")
    (path,) = (results / ".logs" / "csv").rglob("*.csv")
    with open(path) as handle:
        names = {row["name"] for row in csv.DictReader(handle)}
    assert "stage/acc" in names and not any(name.startswith("train/") for name in names)


@pytest.mark.parametrize("name", ["pycil:pycil_ncm.learner:NCM", "mammoth:mammoth_er.model:ER"])
def test_a_pycil_or_mammoth_strategy_refuses_a_plugin_in_one_line(name, monkeypatch, tiny_backbone):
    from benchmarks.runner.live_log import TrainingLog
    from strategies.registry import get_strategy

    for example in ("pycil_ncm", "mammoth_er"):
        monkeypatch.syspath_prepend(str(REPO / "examples" / example))  # installed nowhere
    cls = get_strategy(name)
    with pytest.raises(UserError) as err:
        cls(
            backbone=tiny_backbone,
            class_names=[f"class {k}" for k in range(4)],
            config=cls.Config(batch_size=8),
            settings=RunSettings(show_progress=False, seed=0),
            plugins=[TrainingLog(log=None)],
        )
    message = str(err.value)
    assert "\n" not in message and "Avalanche plugins (TrainingLog) cannot attach to it" in message
