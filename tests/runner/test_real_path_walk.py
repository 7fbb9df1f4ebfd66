"""The real path, walked on a CPU: one representative strategy of each real suite, with
``--fast-dev-run``, on fake data in the real formats and a randomly initialised ViT-B-16-quickgelu
(12 blocks, width 768: prompt layers, expert counts and attention surgery at their real sizes).
``python -m benchmarks.tools.walk`` walks every strategy of every suite the same way."""

import pytest

from benchmarks import run
from benchmarks.runner.reading import iter_results
from benchmarks.runner.suites import expand, load_suite
from benchmarks.tools.fake_data import WEIGHTS_FILE
from tests.helpers import assert_mg_clips_imagenet_r_protocol

pytestmark = [pytest.mark.slow, pytest.mark.spread]  # each case on any worker: they share fake_root only

# suite: (strategy or variant, dataset, task counts: None for the suite's own). Each case is minutes
# of ViT-B/16 on one CPU core, most of them in the text tower over every class prompt, so each takes
# 2 tasks (the task loop is the same at any count; widths, experts and prompt layers are what this
# walks at full size). A case list with every suite and 5 or 10 tasks took 43 worker-minutes on 2
# shared cores; the first, 24.6 min wall.
# The zeroshot suite (GR4CIL: held-out thresholds; Pets, Food-101, ImageNet-1K after CIL) walks at
# ViT-B/16's width 768 on ViT-B/32 (test_wide_backbones.py): at ViT-B/16, 100 training images for
# its prototypes and 30 zero-shot images under 3 branches took 117-129 s of one core, for nothing
# that patch 16 changes in a LoRA method. So do the ablation and params suites' GR4CIL variants
# (their expansion: tests/runner/test_results_and_suites.py; every variant and zeroshot at ViT-B/16:
# python -m benchmarks.tools.walk --suites zeroshot,ablation,params).
REPRESENTATIVES = {
    "main": ("moe4cl", "cifar100", [2]),  # MOE4CL's experts at width 768
    "seq": ("finetune", "imagenet_r", [2]),  # ImageNet-R's 200 wnid folders
    "ood": ("coda_prompt", "cifar100", [2]),  # prompts in ViT-B/16's blocks; the AUROC
    # RAPF's split list on fake files named as it lists them, MG-CLIP's order and names (Continual-CLIP
    # takes MG-CLIP's ImageNet-R protocol). MG-CLIP itself walks this suite at ViT-B/16's width 768 on
    # ViT-B/32 (test_wide_backbones.py): at ViT-B/16, encoding 100 training images a task took it 98 s
    # of one core, for nothing that patch 16 changes in a LoRA method.
    "main-as-published": ("continual_clip", "imagenet_r", [2]),
}


# fake_root (tests/conftest.py): python -m benchmarks.tools.fake_data's output, made once per test run


@pytest.mark.parametrize("suite", list(REPRESENTATIVES))
def test_a_fast_dev_run_walks_the_suite_on_vit_b16(suite, fake_root, tmp_path):
    label, dataset, tasks = REPRESENTATIVES[suite]
    results = tmp_path / "results"
    argv = ["--suite", suite, "--strategies", label, "--datasets", dataset, "--fast-dev-run"]
    argv += ["--tasks", ",".join(map(str, tasks))] if tasks else []
    argv += ["--data-root", str(fake_root), "--weights", str(fake_root / WEIGHTS_FILE)]
    assert run.main([*argv, "--results-dir", str(results), "--quiet"]) == 0
    task_counts = tasks or load_suite(suite)["tasks"]
    found = {r["n_tasks"]: r for _, r in iter_results(results)}
    assert sorted(found) == sorted(task_counts)
    specs = expand(load_suite(suite), strategies=[label], datasets=[dataset])
    for n_tasks, result in found.items():
        assert len(result["stages"]) == n_tasks and result["label"] == label
        config = result["config"]
        assert config["fast_dev_run"]["train_batches"] == 2 and config["fake_data"] is True
        assert config["backbone"]["model"] == "ViT-B-16-quickgelu"
        assert result["seed"] == specs[0].seed  # the suite's first seed only
        trains = label != "continual_clip"  # zero-shot CLIP: nothing to train
        cost = result["cost"]
        assert (cost["trainable_params"] > 0) is trains and (cost["train_steps"] > 0) is trains
        assert all(sum(stage["n_test_per_task"]) == stage["task"] for stage in result["stages"])
        if suite == "main-as-published":
            assert_mg_clips_imagenet_r_protocol(result)


def test_the_protocol_table_works_on_fake_data_results(fake_root, tmp_path):
    """Continual-CLIP under main and main-as-published on fake CIFAR-100 (DyTox order, raw names and
    its template as published), two seeds: the report's protocol table pairs them."""
    from analysis.report import build_report

    folders = {}
    for suite in ("main", "main-as-published"):
        folders[suite] = tmp_path / suite
        argv = [
            "--suite",
            suite,
            "--strategies",
            "continual_clip",
            "--datasets",
            "cifar100",
            "--seeds",
            "0,1",
            "--tasks",  # the table pairs runs of equal task counts, whichever count
            "2",
        ]
        argv += ["--fast-dev-run", "--data-root", str(fake_root), "--weights", str(fake_root / WEIGHTS_FILE)]
        assert run.main([*argv, "--results-dir", str(folders[suite]), "--quiet"]) == 0
    items = build_report(folders["main"], tmp_path / "report", as_published_dir=folders["main-as-published"])
    (item,) = [i for i in items if i.name == "protocol_effect"]
    assert item.written, item.skipped
    table = (tmp_path / "report" / "tables" / "protocol_effect.csv").read_text().splitlines()
    assert len(table) == 2 and table[1].startswith("continual_clip,cifar100,2,2,")
    assert "fast dev run" in (tmp_path / "report" / "tables" / "protocol_effect.md").read_text()


def test_the_walk_tool_runs_each_suite_and_reports_its_time(fake_root, tmp_path, capsys):
    from benchmarks.tools import walk

    argv = ["--data-root", str(fake_root), "--results-dir", str(tmp_path), "--suites", "ood"]
    assert walk.main([*argv, "--strategies", "continual_clip", "--datasets", "cifar100"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[2].startswith("| ood | 1 | 0 | ") and table[3].startswith("| all | | | ")
