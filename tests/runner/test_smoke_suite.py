"""The shipped offline ``smoke`` suite, run exactly as the README's first command runs it."""

import pytest

from analysis.paper_inputs import row_label
from analysis.report import build_report
from benchmarks import run
from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
from benchmarks.miniature.report import ZERO_SHOT_TARGET, cil_data, evaluate_zero_shot, joint_run
from benchmarks.runner.reading import CANNOT_RANK
from benchmarks.runner.suites import load_suite

pytestmark = pytest.mark.slow


# smoke_results (tests/conftest.py): the suite run once per test run, as the README's first command runs it


def test_smoke_runs_every_strategy_of_the_suite(smoke_results):
    _, runs = smoke_results
    assert set(runs) == {"continual_clip", "finetune", "gr4cil", "adaptervlm", "mg_clip"}
    assert all(r["n_tasks"] == 10 and len(r["stages"]) == 10 for r in runs.values())


def test_finetune_forgets_task_1_by_at_least_30_points(smoke_results):
    _, runs = smoke_results
    stages = runs["finetune"]["stages"]
    right_after, at_the_end = stages[0]["acc_per_task"][0], stages[-1]["acc_per_task"][0]
    assert at_the_end <= right_after - 30.0, (right_after, at_the_end)


def test_gr4cil_beats_zero_shot_clip_by_5_points(smoke_results):
    """The paper's comparison (Table 1, CIFAR-100: GR4CIL 83.22 Last, Continual-CLIP 66.68): on the
    shifted CIL domain adapting pays, and GR4CIL keeps what it adapted. 5 points are 100 of the
    2000 test images."""
    _, runs = smoke_results
    last = {label: runs[label]["summary"]["last_acc"] for label in runs}
    assert last["gr4cil"] >= last["continual_clip"] + 5.0, last


@pytest.mark.xfail(
    strict=True,
    reason="known miss of issue 21: in world 2 with the official recipes scaled by the "
    "smoke's epoch_scale, GR4CIL ends 4.05 points above fine-tuning (54.50 against 50.45), not 5; "
    "reported, not tuned (docs/miniature.md)",
)
def test_gr4cil_beats_finetuning_by_5_points(smoke_results):
    _, runs = smoke_results
    last = {label: runs[label]["summary"]["last_acc"] for label in runs}
    assert last["gr4cil"] >= last["finetune"] + 5.0, last


def test_gr4cils_strongest_peers_also_beat_zero_shot_clip_and_finetuning(smoke_results):
    """Paper Table 1: AdapterVLM and MG-CLIP end far above Continual-CLIP. Here too, by 5 points
    over both zero-shot CLIP and sequential fine-tuning (docs/miniature.md says how they compare with
    GR4CIL)."""
    _, runs = smoke_results
    last = {label: runs[label]["summary"]["last_acc"] for label in runs}
    for peer in ("adaptervlm", "mg_clip"):
        assert last[peer] >= max(last["continual_clip"], last["finetune"]) + 5.0, last
        assert all(s["routing_acc"] >= s["acc"] for s in runs[peer]["stages"])


def test_rerun_skips_every_finished_run(smoke_results, capsys):
    results, runs = smoke_results
    capsys.readouterr()
    assert run.main(["--suite", "smoke", "--results-dir", str(results), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.err.count(": cached;") == len(runs)
    assert "| finetune |" in captured.out


def test_continual_clip_gives_the_miniature_zero_shot_accuracy(smoke_results):
    """The smoke's continual_clip Last equals the pretrained tiny CLIP's 100-way zero-shot accuracy
    on the smoke's CIL data, computed directly (what ``benchmarks.miniature.report`` prints), and
    that accuracy is in the CIFAR-like target range."""
    _, runs = smoke_results
    backbone = create_clip(BackboneSpec(TINY_MODEL, "synthetic"))
    stats = evaluate_zero_shot(backbone, cil_data(joint_run(load_suite("smoke"))))
    last = runs["continual_clip"]["stages"][-1]["acc"]
    assert last == pytest.approx(100 * stats.accuracy, abs=1e-4)  # one image is 0.05 points
    low, high = ZERO_SHOT_TARGET
    assert low <= last <= high
    assert stats.gap_holds


def test_routing_bounds_accuracy_and_gr4cil_keeps_its_anchors(smoke_results):
    _, runs = smoke_results
    for run_result in runs.values():  # a correct class is always in the correct task
        assert all(stage["routing_acc"] >= stage["acc"] for stage in run_result["stages"])
    assert runs["gr4cil"]["diagnostics"]["anchor_preservation"] >= 0.95


def test_compensation_raises_the_gt_task_margin(smoke_results):
    """Fig. 5: the mean margin between the GT task's best score and the best other task's score,
    over stages 2..T, is larger with the compensation term than without."""
    _, runs = smoke_results
    stages = [s["diagnostics"] for s in runs["gr4cil"]["stages"][1:]]
    with_comp = sum(s["margin_with_compensation"] for s in stages) / len(stages)
    without = sum(s["margin_without_compensation"] for s in stages) / len(stages)
    assert with_comp > without, (with_comp, without)


def test_routing_improves_with_each_score_term_at_the_last_stage(smoke_results):
    """Fig. 7: routing with compensation >= text + prototype >= text only."""
    _, runs = smoke_results
    last = runs["gr4cil"]["stages"][-1]["diagnostics"]
    assert last["routing_acc_full"] >= last["routing_acc_text_prototype"] >= last["routing_acc_text_only"], (
        last
    )


def test_joint_text_compensation_space_is_closest_to_the_image_space(smoke_results):
    """Table 3 (right): I-TC is the smallest of the three distances."""
    _, runs = smoke_results
    distance = runs["gr4cil"]["diagnostics"]["subspace_distance"]
    assert distance["I-TC"] < min(distance["I-T"], distance["I-C"]), distance


def test_compensation_space_is_closer_to_the_image_space_than_the_text_space(smoke_results):
    """Table 3 (right): I-C < I-T on every dataset of the paper."""
    _, runs = smoke_results
    distance = runs["gr4cil"]["diagnostics"]["subspace_distance"]
    assert distance["I-C"] < distance["I-T"], distance


def test_report_builds_from_the_smoke_run(smoke_results, tmp_path):
    results, runs = smoke_results
    items = {item.name: item for item in build_report(results, tmp_path / "report")}
    rows = {
        line.split("|")[1].strip(): line
        for line in (tmp_path / "report" / "tables" / "table1_main.md").read_text().splitlines()
        if line.startswith("| ")
    }
    for label, result in runs.items():  # every cell is its run's summary
        cells = [
            c.strip("* ") for c in rows[row_label(label)].split("|")[2:4]
        ]  # the docs/decisions.md D9 row label
        assert cells == [f"{result['summary'][m]:.2f} (n = 1)" for m in ("avg_acc", "last_acc")], label
    for name in (
        "table1_main",
        "table2_ood",
        "table3_subspace",
        "table_anchor",
        "fig2_gap_training",
        "fig3_gap_final",
        "fig5_confidence_margin",
        "fig6_cost",
        "fig7_routing",
        "acc_matrix",
    ):
        assert items[name].written, (name, items[name].skipped)
        assert all(
            path.stat().st_size > 1000 for path in items[name].paths if path.suffix in (".png", ".pdf")
        )
    assert items["table2_seq"].skipped  # smoke has no 5- or 20-task runs: a one-line reason, not a crash
    # the synthetic world and the tiny CLIP: the report says in one line that it ranks nothing
    report = (tmp_path / "report" / "report.md").read_text().splitlines()
    assert (
        report[2] == "**On the synthetic world with the tiny CLIP: not a ranking of methods** (Notes, below)."
    )
    noted = [x for x in report if x.startswith("- ") and "cannot rank" in x]  # the notes, once
    assert noted == [f"- {len(runs)} result(s) are on the synthetic world with the tiny CLIP: {CANNOT_RANK}"]
    # each comparison against GR4CIL (Last, Avg, forgetting, BWT) says it once, above its table
    assert sum(x.startswith("**Not a ranking**: runs on the synthetic world") for x in report) == 4
