"""The shipped offline ``smoke`` suite, run exactly as the README's first command runs it."""

import pytest

from analysis.report import build_report
from benchmarks import run
from benchmarks.backbones import TINY_MODEL, BackboneSpec, create_clip
from benchmarks.miniature_report import evaluate_zero_shot
from benchmarks.results import iter_results
from benchmarks.synthetic import load_synthetic

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke_results(tmp_path_factory):
    results = tmp_path_factory.mktemp("smoke")
    assert run.main(["--suite", "smoke", "--results-dir", str(results), "--quiet"]) == 0
    return results, {r["label"]: r for _, r in iter_results(results)}


def test_smoke_runs_every_strategy_of_the_suite(smoke_results):
    _, runs = smoke_results
    assert set(runs) == {"continual_clip", "finetune", "gr4cil"}
    assert all(r["n_tasks"] == 10 and len(r["stages"]) == 10 for r in runs.values())


def test_finetune_visibly_forgets_task_1(smoke_results):
    _, runs = smoke_results
    stages = runs["finetune"]["stages"]
    right_after, at_the_end = stages[0]["acc_per_task"][0], stages[-1]["acc_per_task"][0]
    assert at_the_end < right_after - 5.0, (right_after, at_the_end)


def test_gr4cil_clearly_beats_sequential_finetuning(smoke_results):
    """Issue 4's bar: fine-tuning forgets task 1, GR4CIL's frozen branches do not, and GR4CIL's
    Last-Acc ends at least 3 points (60 of the 2000 test images) above fine-tuning's."""
    _, runs = smoke_results
    last = {label: runs[label]["summary"]["last_acc"] for label in ("gr4cil", "finetune")}
    assert last["gr4cil"] >= last["finetune"] + 3.0, last
    task_1_at_the_end = {label: runs[label]["stages"][-1]["acc_per_task"][0] for label in ("gr4cil", "finetune")}
    assert task_1_at_the_end["gr4cil"] > task_1_at_the_end["finetune"], task_1_at_the_end


def test_rerun_skips_every_finished_run(smoke_results, capsys):
    results, runs = smoke_results
    capsys.readouterr()
    assert run.main(["--suite", "smoke", "--results-dir", str(results), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.err.count(": cached;") == len(runs)
    assert "| finetune |" in captured.out


def test_continual_clip_gives_the_miniature_zero_shot_accuracy(smoke_results):
    """The smoke's continual_clip Last equals the pretrained tiny CLIP's 100-way zero-shot accuracy
    on the same test set, computed directly (the number README "The offline miniature" reports)."""
    _, runs = smoke_results
    backbone = create_clip(BackboneSpec(TINY_MODEL, "synthetic"))
    stats = evaluate_zero_shot(backbone, load_synthetic(n_train_per_class=1, n_test_per_class=20))
    last = runs["continual_clip"]["stages"][-1]["acc"]
    assert last == pytest.approx(100 * stats.accuracy, abs=1e-4)  # one image is 0.05 points
    assert last > 50.0  # chance is 1%


def test_routing_bounds_accuracy_and_gr4cil_keeps_its_anchors(smoke_results):
    _, runs = smoke_results
    for run_result in runs.values():  # a correct class is always in the correct task
        assert all(stage["routing_acc"] >= stage["acc"] for stage in run_result["stages"])
    assert runs["gr4cil"]["diagnostics"]["anchor_preservation"] > 0.95


def test_report_builds_from_the_smoke_run(smoke_results, tmp_path):
    results, runs = smoke_results
    items = {item.name: item for item in build_report(results, tmp_path / "report")}
    rows = {line.split("|")[1].strip(): line for line in
            (tmp_path / "report" / "tables" / "table1_main.md").read_text().splitlines() if line.startswith("| ")}
    for label, result in runs.items():  # every cell is its run's summary
        cells = [c.strip("* ") for c in rows[label].split("|")[2:4]]
        assert cells == [f"{result['summary'][m]:.2f} ± 0.00" for m in ("avg_acc", "last_acc")], label
    for name in ("table1_main", "table2_ood", "table3_subspace", "table_anchor", "fig2_gap_training",
                 "fig3_gap_final", "fig5_confidence_margin", "fig6_cost", "fig7_routing", "acc_matrix"):
        assert items[name].written, (name, items[name].skipped)
        assert all(path.stat().st_size > 1000 for path in items[name].paths if path.suffix in (".png", ".pdf"))
    assert items["table2_seq"].skipped  # smoke has no 5- or 20-task runs: a one-line reason, not a crash
