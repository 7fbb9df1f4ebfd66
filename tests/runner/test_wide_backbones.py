"""Strategies at other widths than ViT-B/16's: a randomly initialised ViT-L/14 (images 1024 wide, text
768, 24 image blocks: prompt layers, expert counts, LoRA targets and the attention surgery at those
sizes) and ViT-B/32 (patch 32), fast dev runs of 2 tasks. The walk over all twelve strategies is a
command (``python -m benchmarks.tools.walk --backbone MODEL``, docs/running.md, Weights); ViT-B/32 goes
through that command here, on fake ImageNet-R and CIFAR-100.

ViT-L/14 learns a 4-class synthetic world instead: what is sized by the model is the same, and the
text tower encodes 4 class prompts a step where fake CIFAR-100 has 100 (on one core, 6 minutes of
MoE-Adapters' 6.4 went to ViT-L's forward and backward passes, most of them over the class prompts)."""

import pytest

from benchmarks import run
from benchmarks.runner.reading import iter_results
from benchmarks.runner.suites import load_suite
from benchmarks.tools import walk
from tests.helpers import assert_mg_clips_imagenet_r_protocol, write_suite

pytestmark = [pytest.mark.slow, pytest.mark.spread]  # each model on any worker: they share fake_root only

# MOE4CL: experts and routers on every block; CODA-Prompt: prompts in the image blocks by index
VIT_L = ["moe4cl", "coda_prompt"]
FOUR_CLASSES = """
datasets = ["synthetic"]
tasks = [2]
seeds = [0]
device = "cpu"
[backbone]
model = "ViT-L-14"
pretrained = "none"
[dataset.synthetic]
n_classes = 4
n_train_per_class = 2
n_test_per_class = 1
"""


def _check(results: dict, model: str, strategies: list[str]) -> None:
    assert sorted(results) == sorted(strategies)
    for result in results.values():
        assert result["config"]["backbone"] == {"model": model, "pretrained": None}
        assert "weights_file" not in result["config"]  # a random init loads no file
        assert len(result["stages"]) == 2 and result["cost"]["trainable_params"] > 0


def test_strategies_build_and_run_at_vit_l_14s_widths(tmp_path):
    suite = write_suite(tmp_path / "wide.toml", f"strategies = {VIT_L!r}\n".replace("'", '"') + FOUR_CLASSES)
    argv = ["--suite", suite, "--fast-dev-run", "--results-dir", str(tmp_path / "runs"), "--quiet"]
    assert run.main(argv) == 0
    _check({r["label"]: r for _, r in iter_results(tmp_path / "runs")}, "ViT-L-14", VIT_L)


# suite: (strategy, dataset). MG-CLIP: LoRA on both towers, under main-as-published (RAPF's split list
# on fake ImageNet-R, its order and names), which the ViT-B/16 walk (test_real_path_walk.py) walks
# with Continual-CLIP. GR4CIL: the zeroshot suite (held-out thresholds; Pets, Food-101, ImageNet-1K
# after CIL), whose code the ablation and params variants share. Patch 32 at ViT-B/16's width 768:
# at ViT-B/16 they took 98 s and 117-129 s of one core, nearly all in image forwards that patch 16
# makes 4 times dearer, for nothing that it changes in a LoRA method.
ON_VIT_B_32 = {
    "main-as-published": ("mg_clip", "imagenet_r"),
    "zeroshot": ("gr4cil", "cifar100"),
}


@pytest.mark.parametrize("suite", list(ON_VIT_B_32))
def test_the_walk_runs_a_strategy_on_vit_b_32(suite, fake_root, tmp_path, capsys):
    strategy, dataset = ON_VIT_B_32[suite]
    argv = ["--data-root", str(fake_root), "--results-dir", str(tmp_path), "--suites", suite]
    argv += ["--backbone", "ViT-B-32", "--strategies", strategy, "--datasets", dataset, "--tasks", "2"]
    assert walk.main(argv) == 0, capsys.readouterr().err
    table = capsys.readouterr().out.splitlines()  # the walk's table: one row per suite, then all
    assert table[2].startswith(f"| {suite} | 1 | 0 | ") and table[3].startswith("| all | | | ")
    results = {r["label"]: r for _, r in iter_results(tmp_path / suite)}
    _check(results, "ViT-B-32", [strategy])
    result = results[strategy]
    assert result["config"]["fast_dev_run"]["train_batches"] == 2 and result["config"]["fake_data"] is True
    assert all(sum(stage["n_test_per_task"]) == stage["task"] for stage in result["stages"])
    if suite == "main-as-published":
        assert_mg_clips_imagenet_r_protocol(result)
    targets = load_suite(suite).get("zero_shot_targets", [])
    assert sorted(result.get("zero_shot", {})) == sorted(targets)
    for target in targets:  # --fast-dev-run: 10 images of each target, one of each of 10 classes
        assert result["zero_shot"][target]["n_test"] == 10
    suite_copy = (tmp_path / "suites" / f"{suite}.toml").read_text()
    assert suite_copy.startswith(f'base = "{suite}"')
