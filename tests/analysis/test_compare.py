"""``python -m analysis.compare`` on stored results made by hand, so every number is known."""

import json

import numpy as np
import pandas as pd
import pytest

from analysis import compare, pairing
from analysis.comparison_output import render_markdown
from analysis.orders import Unit
from benchmarks.runner.result_record import config_hash
from benchmarks.runner.results import Predictions, ResultStore, RunKey, predictions_path

TASKS = [[0, 1], [2, 3]]  # two tasks of two classes
TARGETS = np.array([0, 0, 1, 1, 2, 2, 3, 3, 0, 2])  # ten test images


def _task_accuracies(predictions: np.ndarray) -> list[list[float]]:
    """Each stage's accuracy on the images of each task learned so far (its ``acc_per_task``)."""
    image_task = np.isin(TARGETS, TASKS[1]).astype(int)
    return [
        [
            100.0 * float(np.mean(predictions[stage][image_task == task] == TARGETS[image_task == task]))
            for task in range(stage + 1)
        ]
        for stage in range(len(TASKS))
    ]


def _stage_accuracy(predictions: np.ndarray) -> list[float]:
    accs, seen = [], set()
    for stage, classes in enumerate(TASKS):
        seen |= set(classes)
        mask = np.isin(TARGETS, sorted(seen))
        accs.append(100.0 * float(np.mean(predictions[stage][mask] == TARGETS[mask])))
    return accs


def store_run(
    root,
    label: str,
    seed: int,
    predictions,
    *,
    precision: str = "fp32",
    with_sidecar: bool = True,
    class_order=(0, 1, 2, 3),
    config: dict | None = None,
) -> None:
    """A finished 2-task result with the given ``[2, 10]`` predictions, as the runner stores it
    (``config``: entries added to its config)."""
    predictions = np.asarray(predictions)
    accs = _stage_accuracy(predictions)
    result = {
        "schema_version": 2 if with_sidecar else 1,
        "strategy": label,
        "label": label,
        "dataset": "toy",
        "n_tasks": 2,
        "seed": seed,
        "class_order": list(class_order),
        "config": {
            "dataset": "toy",
            "dataset_options": {},
            "backbone": {"model": "m", "pretrained": "p"},
            "precision": precision,
            **(config or {}),
        },
        "class_names": ["a", "b", "c", "d"],
        "tasks": TASKS,
        "stages": [
            {
                "task": t + 1,
                "acc": acc,
                "acc_per_task": per_task,  # forgetting and BWT, computed on reading (schema 1, 2)
                "n_test_per_task": [5, 5][: t + 1],
                "routing_acc": 100.0,
                "auroc": None,
                "fpr95": None,
                "diagnostics": {},
            }
            for t, (acc, per_task) in enumerate(zip(accs, _task_accuracies(predictions)))
        ],
        "summary": {"avg_acc": float(np.mean(accs)), "last_acc": accs[-1]},
        "env": {},
        "cost": {},
    }
    result["config_hash"] = config_hash(result["config"])
    store = ResultStore(root)
    sidecar = Predictions(predictions, TARGETS, np.arange(len(TARGETS))) if with_sidecar else None
    store.save(RunKey(label, "toy", 2, seed), result, sidecar)


def _flip(predictions, n_wrong: int):
    """Predictions with the first ``n_wrong`` images of the last stage made wrong."""
    out = np.array(predictions, copy=True)
    out[-1, :n_wrong] = (TARGETS[:n_wrong] + 1) % 4
    return out


PERFECT = np.stack([np.where(np.isin(TARGETS, [0, 1]), TARGETS, 0), TARGETS])


def test_hand_example_sign_and_size(tmp_path, capsys):
    # Last: A gets 8/10 and 7/10, B gets 6/10 and 7/10 -> differences +20 and 0 -> mean +10
    store_run(tmp_path, "mine", 0, _flip(PERFECT, 2))
    store_run(tmp_path, "mine", 1, _flip(PERFECT, 3))
    store_run(tmp_path, "gr4cil", 0, _flip(PERFECT, 4))
    store_run(tmp_path, "gr4cil", 1, _flip(PERFECT, 3))
    assert compare.main(["--results-dir", str(tmp_path), "--draws", "500"]) == 0
    table = pd.read_csv(tmp_path / "compare" / "compare-last.csv")
    row = table.iloc[0]
    assert (row["method"], row["baseline"], row["n"], row["paired_seeds"]) == ("mine", "gr4cil", 2, "0 1")
    assert row["mean"] == pytest.approx(75.0) and row["baseline_mean"] == pytest.approx(65.0)
    assert row["std"] == pytest.approx(5.0)  # population std of 80 and 70
    assert row["difference"] == pytest.approx(10.0)
    assert row["low"] <= 10.0 <= row["high"] and row["low"] >= 0.0  # never below the smaller seed's 0
    out = capsys.readouterr().out
    assert "| mine | toy | 2 | 75.00 ± 5.00 (n = 2) | 65.00 ± 5.00 (n = 2) | 0, 1 | +10.00 |" in out
    for suffix in ("md", "csv", "tex"):
        assert (tmp_path / "compare" / f"compare-last.{suffix}").exists()
    assert (tmp_path / "compare" / "compare-mine-last.png").stat().st_size > 0


def test_a_tuned_row_against_an_untuned_one_is_said_and_tables_mark_it(tmp_path, capsys):
    from analysis.tables import write_tables

    tuned = {
        "tuned": {"strategy": "mine", "study": "smoke-mine-val_avg", "objective": "val_avg", "trials": 8}
    }
    for seed, wrong in ((0, 2), (1, 3)):
        store_run(tmp_path, "mine-tuned", seed, _flip(PERFECT, wrong), config=tuned)
        store_run(tmp_path, "mine", seed, _flip(PERFECT, wrong + 1))
        store_run(tmp_path, "gr4cil", seed, _flip(PERFECT, 4))
    assert compare.main(["--results-dir", str(tmp_path), "--draws", "500"]) == 0
    out = capsys.readouterr().out
    (said,) = [line for line in out.splitlines() if "tuned row" in line]
    assert said.startswith("- mine-tuned on toy / 2 tasks: mine-tuned is a tuned row")
    assert "study smoke-mine-val_avg) and gr4cil is not" in said
    table = pd.read_csv(tmp_path / "compare" / "compare-last.csv").set_index("method")
    assert "tuned row" in table.loc["mine-tuned", "notes"]
    assert "tuned row" not in str(table.loc["mine", "notes"])  # untuned against untuned: nothing to say
    markdown = write_tables(tmp_path)
    rows = {line.split("|")[1].strip() for line in markdown.splitlines() if line.startswith("| ")}
    assert {"gr4cil", "mine", "mine-tuned (tuned)"} <= rows and "mine (tuned)" not in rows
    assert "Rows marked (tuned) (mine-tuned) took their options from python -m benchmarks.tune" in markdown


def test_identical_predictions_give_an_interval_of_exactly_zero(tmp_path):
    for label in ("mine", "gr4cil"):
        for seed in (0, 1, 2):
            store_run(tmp_path, label, seed, _flip(PERFECT, seed + 1))
    (only,) = pairing.compare_all(tmp_path, draws=300)
    assert (only.difference.estimate, only.difference.low, only.difference.high) == (0.0, 0.0, 0.0)
    assert only.verdict == "no detectable difference at 95 %"


def test_a_consistent_gain_is_better_and_a_loss_worse(tmp_path):
    for seed in range(4):
        store_run(tmp_path, "mine", seed, PERFECT)
        store_run(tmp_path, "gr4cil", seed, _flip(PERFECT, 6))
        store_run(tmp_path, "worse", seed, _flip(PERFECT, 10))  # 4 more images wrong than gr4cil
    results = {c.label: c for c in pairing.compare_all(tmp_path, draws=300)}
    # (3 differing images of 10 would not do: a resample misses all 3 with probability 0.7^10 = 2.8 %)
    assert results["mine"].verdict == "better" and results["mine"].difference.estimate == pytest.approx(60.0)
    assert results["worse"].verdict == "worse" and results["worse"].difference.estimate == pytest.approx(
        -40.0
    )


@pytest.mark.parametrize(
    "backbone, said",
    [
        ({"model": "tiny-clip-32", "pretrained": "synthetic"}, "the tiny CLIP"),
        ({"model": "tiny-clip-32-512", "pretrained": "synthetic"}, "the tiny CLIP"),  # its 512-d twin
        ({"model": "tiny-clip-32-512-h64", "pretrained": "synthetic"}, "the tiny CLIP"),  # 64-wide heads
        ({"model": "ViT-B-16-quickgelu", "pretrained": None}, "a randomly initialised backbone"),
    ],
)
def test_offline_a_gain_is_said_not_to_rank_in_every_output(tmp_path, capsys, backbone, said):
    """The same numbers as above, on the tiny CLIP or random weights: the verdicts name where they
    were made, and the table, the warnings and the figure each say in one line that they rank nothing."""
    for seed in range(4):
        for label, predictions in (
            ("mine", PERFECT),
            ("gr4cil", _flip(PERFECT, 6)),
            ("worse", _flip(PERFECT, 10)),
        ):
            store_run(tmp_path, label, seed, predictions, config={"backbone": backbone})
    results = {c.label: c for c in pairing.compare_all(tmp_path, draws=300)}
    assert results["mine"].verdict == f"better on {said} only: not a ranking"
    assert results["worse"].verdict == f"worse on {said} only: not a ranking"
    assert results["mine"].difference.estimate == pytest.approx(60.0)  # the numbers are unchanged
    assert compare.main(["--results-dir", str(tmp_path), "--draws", "300"]) == 0
    out, err = capsys.readouterr()
    caveat = (
        "it shows that each method runs the protocol end to end; it cannot rank methods, which only the "
        "real data with pretrained weights can (python -m benchmarks.run --suite main)"
    )
    assert out.splitlines()[2] == f"**Not a ranking**: runs on {said}: {caveat}."
    assert f"warning: 12 run(s) are on {said}: {caveat}\n" in err
    figure = tmp_path / "compare" / "compare-mine-last.png"
    assert figure.stat().st_size > 0


def test_avg_metric_is_the_mean_of_the_stage_differences(tmp_path):
    store_run(tmp_path, "mine", 0, PERFECT)
    store_run(tmp_path, "gr4cil", 0, _flip(PERFECT, 2))  # stage 1 equal, stage 2: 100 against 80
    (only,) = pairing.compare_all(tmp_path, metric="avg", draws=300)
    assert only.difference.estimate == pytest.approx(10.0)
    assert "one paired seed: the interval covers the test images, not the seeds" in only.notes


# Forgetting with two tasks: task 1's accuracy at stage 1 minus at stage 2; BWT minus that. Task 1's
# images are 0-3 and 8 (classes 0, 1): each of the first four flipped at stage 2 costs 20 points.


def test_forgetting_and_bwt_hand_example_and_lower_forgetting_is_better(tmp_path):
    for seed in range(4):
        store_run(tmp_path, "mine", seed, PERFECT)  # forgets nothing: 100 -> 100
        store_run(tmp_path, "gr4cil", seed, _flip(PERFECT, 4))  # task 1: 100 -> 20, forgetting 80
    (forgetting,) = pairing.compare_all(tmp_path, metric="forgetting", draws=300)
    assert forgetting.values == {Unit("", s): 0.0 for s in range(4)}  # the default class order's seeds
    assert forgetting.baseline_values == {Unit("", s): 80.0 for s in range(4)}
    # (4 differing images of 10: a resample misses all with probability 0.6^10 = 0.6 %)
    assert forgetting.difference.estimate == pytest.approx(-80.0) and forgetting.difference.high < 0
    assert forgetting.verdict == "better"  # it forgets less
    (bwt,) = pairing.compare_all(tmp_path, metric="bwt", draws=300)
    assert bwt.difference.estimate == pytest.approx(80.0)  # 0 - (20 - 100)
    assert bwt.verdict == "better"
    (reverse,) = pairing.compare_all(tmp_path, baseline="mine", metric="forgetting", draws=300)
    assert reverse.difference.estimate == pytest.approx(80.0) and reverse.verdict == "worse"
    text = render_markdown([forgetting])
    assert text.startswith("# Forgetting (points of accuracy) against gr4cil")
    assert "Lower is better: a negative difference (the method forgets less) is 'better'." in text


def test_forgetting_intervals_recompute_every_stage_from_the_resampled_images(tmp_path):
    # The same last stage (images 0-3 wrong); at stage 1, mine has task 1 right, gr4cil wrong on
    # images 0-3 too: forgetting 100 - 20 = 80 against 20 - 20 = 0. Only stage 1 differs, so an
    # interval that resampled the last stage alone would be [0, 0].
    last_stage = _flip(PERFECT, 4)[1]
    store_run(tmp_path, "mine", 0, np.stack([PERFECT[0], last_stage]))
    store_run(tmp_path, "gr4cil", 0, np.stack([_flip(PERFECT[:1], 4)[0], last_stage]))
    (only,) = pairing.compare_all(tmp_path, metric="forgetting", draws=500)
    d = only.difference
    assert d.estimate == pytest.approx(80.0) and only.verdict == "worse"  # it forgets more
    # each replicate is 100 x (resampled images 0-3) / (resampled task-1 images): in (0, 100]
    assert 0.0 < d.low < 80.0 < d.high <= 100.0
    assert "one paired seed: the interval covers the test images, not the seeds" in only.notes


def test_forgetting_of_version_1_results_resamples_seeds_only(tmp_path):
    for seed, (mine, theirs) in enumerate([(2, 4), (3, 3), (1, 4)]):
        store_run(tmp_path, "mine", seed, _flip(PERFECT, mine), with_sidecar=False)
        store_run(tmp_path, "gr4cil", seed, _flip(PERFECT, theirs), with_sidecar=False)
    (only,) = pairing.compare_all(tmp_path, metric="forgetting", draws=2000)
    # forgetting 20 per flipped image: mine 40, 60, 20 against 80, 60, 80 -> -40, 0, -60
    assert only.difference.estimate == pytest.approx(-100 / 3)
    assert only.difference.low == pytest.approx(-60.0) and only.difference.high == pytest.approx(0.0)


@pytest.mark.parametrize(
    "change, field", [({"precision": "fp16"}, "precision"), ({"class_order": (1, 0, 2, 3)}, "class order")]
)
def test_a_different_protocol_is_refused_in_one_line(tmp_path, capsys, change, field):
    store_run(tmp_path, "mine", 0, PERFECT, **change)
    store_run(tmp_path, "gr4cil", 0, PERFECT)
    assert compare.main(["--results-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: mine and gr4cil differ in {field} on toy / 2 tasks")


def test_another_test_set_is_refused(tmp_path, capsys):
    store_run(tmp_path, "mine", 0, PERFECT)
    store_run(tmp_path, "gr4cil", 0, PERFECT)
    path = tmp_path / "toy" / "mine" / "T2-seed0.json"
    from benchmarks.runner.results import save_predictions

    result = json.loads(path.read_text())
    result["predictions"] = save_predictions(
        predictions_path(path), Predictions(PERFECT, TARGETS, np.arange(10) + 100)
    )  # other images
    path.write_text(json.dumps(result))
    assert compare.main(["--results-dir", str(tmp_path)]) == 2
    assert "differ in test set" in capsys.readouterr().err


def test_unpaired_seeds_show_their_means_and_refuse_in_one_line(tmp_path, capsys):
    store_run(tmp_path, "mine", 0, PERFECT)
    store_run(tmp_path, "gr4cil", 1, _flip(PERFECT, 2))
    assert compare.main(["--results-dir", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert (
        "| mine | toy | 2 | 100.00 (n = 1) | 80.00 (n = 1) | none (unpaired) | – | – | unpaired |"
        in captured.out
    )
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: mine and gr4cil share no seed on toy / 2 tasks (mine: 0; gr4cil: 1); a paired "
        "comparison needs the same seeds: run both with --seeds"
    ]


def test_version_1_results_resample_seeds_only_and_say_so(tmp_path):
    for seed, (mine, theirs) in enumerate([(2, 4), (3, 3), (1, 4)]):
        store_run(tmp_path, "mine", seed, _flip(PERFECT, mine), with_sidecar=False)
        store_run(tmp_path, "gr4cil", seed, _flip(PERFECT, theirs), with_sidecar=False)
    (only,) = pairing.compare_all(tmp_path, draws=2000)
    assert only.difference.estimate == pytest.approx((20 + 0 + 30) / 3)
    # seed resampling only: the replicates are means of three of the per-seed differences 20, 0, 30
    assert only.difference.low == pytest.approx(0.0) and only.difference.high == pytest.approx(30.0)
    assert any("test images not" in note for note in only.notes)


def test_a_missing_sidecar_warns_in_one_line_and_the_run_still_counts(tmp_path, capsys):
    for seed in (0, 1):
        store_run(tmp_path, "mine", seed, PERFECT)
        store_run(tmp_path, "gr4cil", seed, _flip(PERFECT, 2))
    predictions_path(tmp_path / "toy" / "mine" / "T2-seed1.json").unlink()
    assert compare.main(["--results-dir", str(tmp_path), "--draws", "200"]) == 0
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if line.startswith("warning:")]
    assert (
        len(warnings) == 1 and "T2-seed1.predictions.safetensors: predictions sidecar missing" in warnings[0]
    )
    assert "0, 1 | +20.00 |" in captured.out and "test images not" in captured.out


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--baseline", "nobody"], "no runs of 'nobody'"),
        (["--strategies", "ghost"], "no runs of 'ghost'"),
        (["--draws", "10"], "--draws 10 is too few"),
        # each once "error:  and gr4cil share no dataset", an empty label
        ([], "only the baseline 'gr4cil' has runs under"),
        (
            ["--strategies", "gr4cil"],
            "--strategies names only the baseline 'gr4cil'; name other labels (gr4cil)",
        ),
    ],
)
def test_user_mistakes_are_one_line(tmp_path, capsys, argv, expected):
    store_run(tmp_path, "gr4cil", 0, PERFECT)
    assert compare.main(["--results-dir", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0]


def test_forgetting_of_runs_without_per_task_accuracies_is_left_out_with_a_note(tmp_path):
    for label in ("mine", "other", "gr4cil"):
        store_run(tmp_path, label, 0, PERFECT)
    path = tmp_path / "toy" / "other" / "T2-seed0.json"
    result = json.loads(path.read_text())
    for stage in result["stages"]:
        stage["acc_per_task"] = []  # forgetting undefined: None on reading
    path.write_text(json.dumps(result))
    problems = []
    (only,) = pairing.compare_all(tmp_path, metric="forgetting", draws=100, problems=problems)
    assert only.label == "mine"
    assert any(p.startswith("other on toy / 2 tasks: Forgetting is undefined") for p in problems)
