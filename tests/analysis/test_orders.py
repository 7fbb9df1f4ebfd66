"""``analysis.compare`` over several class orders: runs pair by (order, seed), the interval resamples
those units and the test images, and the variance splits between orders and seeds; every number is
checked against a hand computation or scipy."""

import numpy as np
import pandas as pd
import pytest
from scipy.stats import f_oneway

from analysis import compare, pairing, tables
from analysis.order_figure import order_frame, spread
from analysis.orders import Unit, units_phrase
from analysis.paper_inputs import load_inputs
from analysis.report import build_report
from analysis.statistics import order_variance
from benchmarks.runner.result_record import config_hash
from benchmarks.runner.results import Predictions, ResultStore
from benchmarks.runner.run_key import key_of_config
from tests.analysis.test_compare import PERFECT, TARGETS, _flip

#: each order's two tasks of two classes: seed1993 (the default) shows classes 0, 1 first, seed5 2, 3
TASKS = {"seed1993": [[0, 1], [2, 3]], "seed5": [[2, 3], [0, 1]]}


def _stages(predictions: np.ndarray, tasks: list[list[int]]) -> list[dict]:
    stages, seen = [], set()
    for stage, classes in enumerate(tasks):
        seen |= set(classes)
        counted = np.isin(TARGETS, sorted(seen))
        per_task = [
            100.0 * float(np.mean(predictions[stage][np.isin(TARGETS, t)] == TARGETS[np.isin(TARGETS, t)]))
            for t in tasks[: stage + 1]
        ]
        stages.append(
            {
                "task": stage + 1,
                "acc": 100.0 * float(np.mean(predictions[stage][counted] == TARGETS[counted])),
                "acc_per_task": per_task,
                "n_test_per_task": [5, 5][: stage + 1],
                "routing_acc": 100.0,
                "auroc": None,
                "fpr95": None,
                "diagnostics": {},
            }
        )
    return stages


def store_run(root, label: str, order: str, seed: int, predictions, permutation=None, dataset="toy") -> None:
    """A finished 2-task result in class order ``order`` (its name; ``permutation``: the stored one,
    by default the order's tasks) with ``[2, 10]`` predictions, stored where the runner puts it."""
    predictions = np.asarray(predictions)
    tasks = TASKS[order]
    stages = _stages(predictions, tasks)
    config = {
        "strategy": label,
        "dataset": dataset,
        "n_tasks": 2,
        "seed": seed,
        "class_order": order,
        "dataset_options": {},
        "backbone": {"model": "m", "pretrained": "p"},
        "precision": "fp32",
    }
    accs = [stage["acc"] for stage in stages]
    result = {
        "schema_version": 5,
        "strategy": label,
        "label": label,
        "dataset": dataset,
        "n_tasks": 2,
        "seed": seed,
        "config": config,
        "config_hash": config_hash(config),
        "class_order": list(permutation or [c for t in tasks for c in t]),
        "tasks": tasks,
        "stages": stages,
        "summary": {"avg_acc": float(np.mean(accs)), "last_acc": accs[-1]},
        "env": {},
        "cost": {},
    }
    ResultStore(root).save(
        key_of_config(label, config), result, Predictions(predictions, TARGETS, np.arange(len(TARGETS)))
    )


# Last accuracy: each flipped image of the last stage costs 10 points.
# mine:   seed1993 80, 70; seed5 100, 90.   gr4cil: seed1993 60, 70; seed5 60, 50
# differences: seed1993 +20, 0 (mean 10); seed5 +40, +40 (mean 40); all four: 25
FLIPS = {("mine", "seed1993"): (2, 3), ("mine", "seed5"): (0, 1)}
FLIPS |= {("gr4cil", "seed1993"): (4, 3), ("gr4cil", "seed5"): (4, 5)}


def _two_orders(root) -> None:
    for (label, order), flips in FLIPS.items():
        for seed, flip in enumerate(flips):
            store_run(root, label, order, seed, _flip(PERFECT, flip))


def test_units_pair_by_order_and_seed_and_the_variance_splits_as_by_hand(tmp_path):
    _two_orders(tmp_path)
    assert sorted(p.name for p in (tmp_path / "toy" / "mine").glob("*.json")) == [
        "T2-seed0-order-seed5.json",
        "T2-seed0.json",
        "T2-seed1-order-seed5.json",
        "T2-seed1.json",
    ]
    (only,) = pairing.compare_all(tmp_path, draws=1000)
    assert only.values == {
        Unit("", 0): 80.0,
        Unit("", 1): 70.0,
        Unit("seed5", 0): 100.0,
        Unit("seed5", 1): 90.0,
    }
    assert only.paired_units == [Unit("", 0), Unit("", 1), Unit("seed5", 0), Unit("seed5", 1)]
    assert only.several_orders and units_phrase(only.paired_units) == "2 orders × 2 seeds"
    assert only.estimate == pytest.approx(25.0)
    assert only.difference.low <= 25.0 <= only.difference.high and only.notes == []  # images crossed
    rows = {row.order: row for row in only.by_order}
    assert rows["seed1993"].seeds == [0, 1] and rows["seed1993"].estimate == pytest.approx(10.0)
    assert rows["seed5"].estimate == pytest.approx(40.0) and rows["seed5"].mean == pytest.approx(95.0)
    assert rows["seed5"].baseline_mean == pytest.approx(55.0)
    assert rows["seed5"].difference.low <= 40.0 <= rows["seed5"].difference.high
    # one-way ANOVA on [20, 0] and [40, 40]: grand mean 25; between 2 * 15^2 * 2 = 900, within
    # 10^2 + 10^2 = 200; mean squares 900 / 1 and 200 / 2 = 100, F = 9; order variance
    # (900 - 100) / 2 = 400 against seed variance 100: 80 % between orders
    split = only.order_split
    assert (split.between_sum_of_squares, split.within_sum_of_squares) == pytest.approx((900.0, 200.0))
    assert (split.order_variance, split.seed_variance, split.order_share) == pytest.approx(
        (400.0, 100.0, 0.8)
    )
    scipy = f_oneway([20.0, 0.0], [40.0, 40.0])
    assert (split.f_statistic, split.p_value) == pytest.approx((scipy.statistic, scipy.pvalue))
    assert split.f_statistic == pytest.approx(9.0)


def test_the_command_says_n_as_orders_times_seeds_and_writes_the_orders_table(tmp_path, capsys):
    _two_orders(tmp_path)
    assert compare.main(["--results-dir", str(tmp_path), "--draws", "300"]) == 0
    out = capsys.readouterr().out
    assert (
        "| mine | toy | 2 | 85.00 ± 11.18 (n = 2 orders × 2 seeds) | 60.00 ± 7.07 (n = 2 orders × 2 seeds) "
        "| seed1993: 0, 1; seed5: 0, 1 | +25.00 |"
    ) in out
    assert "mean over the paired units (class order, seed)" in out
    assert "paired bootstrap over units (class order, seed) and test images" in out
    assert "## By class order" in out
    assert "| mine | toy | 2 | seed5 | 0, 1 | 95.00 | 55.00 | +40.00 |" in out
    p_value = f_oneway([20.0, 0.0], [40.0, 40.0]).pvalue
    assert (
        "between orders sd 20.00, between seeds within an order sd 10.00: 80 % of the variance lies "
        f"between the 2 orders (one-way ANOVA over 4 units, F = 9.00, p = {p_value:.3g})"
    ) in out
    orders = pd.read_csv(tmp_path / "compare" / "compare-last-orders.csv")
    assert orders["order"].tolist() == ["seed1993", "seed5"]
    assert orders["difference"].tolist() == pytest.approx([10.0, 40.0])
    assert orders["order_share"].tolist() == pytest.approx([0.8, 0.8])
    table = pd.read_csv(tmp_path / "compare" / "compare-last.csv")
    assert table.loc[0, "paired_seeds"] == "seed1993/0 seed1993/1 seed5/0 seed5/1" and table.loc[0, "n"] == 4


def test_each_pair_counts_the_images_its_own_order_has_shown(tmp_path):
    # In seed5, task 1 is classes 2 and 3. Stage 1: mine right on all their images, gr4cil wrong;
    # the rest alike. Avg difference: (100 + 0) / 2 = 50 on every image resample; had the images
    # counted been seed1993's (classes 0 and 1), where both agree, the replicates would be 0.
    stage_one = np.where(np.isin(TARGETS, [2, 3]), TARGETS, 0)
    wrong = np.where(np.isin(TARGETS, [2, 3]), 0, TARGETS)
    store_run(tmp_path, "mine", "seed5", 0, np.stack([stage_one, TARGETS]))
    store_run(tmp_path, "gr4cil", "seed5", 0, np.stack([wrong, TARGETS]))
    (only,) = pairing.compare_all(tmp_path, metric="avg", draws=300)
    assert only.estimate == pytest.approx(50.0)
    assert (only.difference.low, only.difference.high) == pytest.approx((50.0, 50.0))
    (forgetting,) = pairing.compare_all(tmp_path, metric="forgetting", draws=300)
    # task 1 (classes 2, 3): mine 100 -> 100, forgetting 0; gr4cil 0 -> 100, forgetting -100
    assert forgetting.estimate == pytest.approx(100.0)
    assert (forgetting.difference.low, forgetting.difference.high) == pytest.approx((100.0, 100.0))


def test_class_order_differences_are_refused_within_an_order_only(tmp_path, capsys):
    _two_orders(tmp_path)
    assert compare.main(["--results-dir", str(tmp_path), "--draws", "200"]) == 0  # two orders: fine
    capsys.readouterr()
    store_run(tmp_path, "mine", "seed5", 1, _flip(PERFECT, 1), permutation=[3, 2, 0, 1])
    assert compare.main(["--results-dir", str(tmp_path), "--draws", "200"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: mine and gr4cil differ in class order on toy / 2 tasks (mine, seed 1 (order seed5), against "
        "gr4cil, seed 0 (order seed5)); a comparison needs the same protocol: rerun one of them under the "
        "other's (or pass --across-protocols)"
    ]


def test_units_without_a_partner_in_the_same_order_do_not_pair(tmp_path, capsys):
    store_run(tmp_path, "mine", "seed1993", 0, PERFECT)
    store_run(tmp_path, "gr4cil", "seed5", 0, PERFECT)
    assert compare.main(["--results-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: mine and gr4cil share no order and seed on toy / 2 tasks (mine: 0; gr4cil: 0 (order seed5)); "
        "a paired comparison needs the same order and seeds: run both with --class-order and --seeds"
    )


def test_order_variance_of_unbalanced_orders_against_scipy_and_by_hand():
    groups = [[1.0, 2.0, 3.0], [5.0, 7.0], [4.0, 4.0, 4.0, 8.0]]
    split = order_variance(groups)
    values = np.concatenate(groups)
    means = [np.mean(g) for g in groups]
    within = sum(((np.array(g) - m) ** 2).sum() for g, m in zip(groups, means))
    between = sum(len(g) * (m - values.mean()) ** 2 for g, m in zip(groups, means))
    assert (split.within_sum_of_squares, split.between_sum_of_squares) == pytest.approx((within, between))
    assert within + between == pytest.approx(((values - values.mean()) ** 2).sum())
    scipy = f_oneway(*groups)
    assert (split.f_statistic, split.p_value) == pytest.approx((scipy.statistic, scipy.pvalue))
    n0 = (9 - (9 + 4 + 16) / 9) / 2  # the unbalanced groups' mean size
    expected = max(0.0, (between / 2 - within / 6) / n0)
    assert (split.order_variance, split.seed_variance) == pytest.approx((expected, within / 6))
    same = order_variance([[1.0, 3.0], [1.0, 3.0]])  # orders alike: all the spread is the seeds'
    assert same.order_variance == 0.0 and same.order_share == 0.0 and same.p_value == pytest.approx(1.0)
    alone = order_variance([[1.0], [3.0]])  # one seed an order: orders and seeds cannot be told apart
    assert np.isnan(alone.seed_variance) and np.isnan(alone.order_share)


def test_a_table_splits_a_column_by_order_where_a_method_ran_several_and_never_averages_them(tmp_path):
    _two_orders(tmp_path)
    store_run(tmp_path, "other", "seed1993", 0, PERFECT)  # one order: its cells go to that order's column
    markdown = tables.write_tables(tmp_path)
    frame = tables.accuracy_table(tables.load_runs(tmp_path))
    assert list(dict.fromkeys(frame.columns.get_level_values(0))) == [
        "toy (order seed1993)",
        "toy (order seed5)",
    ]
    # mine: Last 80, 70 in seed1993 (75 ± 5) and 100, 90 in seed5 (95 ± 5), never 85 over the four
    assert frame.loc["mine", ("toy (order seed1993)", "Last")] == "75.00 ± 5.00"
    assert frame.loc["mine", ("toy (order seed5)", "Last")] == "95.00 ± 5.00"
    assert frame.loc["gr4cil", ("toy (order seed5)", "Last")] == "55.00 ± 5.00"
    assert frame.loc["other", ("toy (order seed1993)", "Last")] == "100.00 (n = 1)"
    assert frame.loc["other", ("toy (order seed5)", "Last")] == "–"
    assert (
        "n = 1 to 2 seeds a cell. Several class orders were run on toy (T=2): one column per order"
        in markdown
    )
    alone = tmp_path / "one-order"
    store_run(alone, "mine", "seed5", 0, PERFECT)  # a single order, even a non-default one: no split
    assert list(tables.accuracy_table(tables.load_runs(alone)).columns.get_level_values(0)) == ["toy"] * 4
    assert "class orders" not in tables.write_tables(alone)


@pytest.mark.slow
def test_the_order_figure_shows_each_methods_orders_and_spread_and_only_where_orders_vary(tmp_path):
    _two_orders(tmp_path)
    inputs = load_inputs(tmp_path)
    assert [run.key.order for run in inputs.runs] == ["", "", "", ""]  # the paper tables: one order
    assert any("4 result(s) in another class order" in note for note in inputs.notes)
    frame = order_frame(inputs.every_order)
    last = frame[(frame["metric"] == "last_acc") & (frame["method"] == "mine")]
    assert sorted(zip(last["order"], last["seed"], last["value"])) == [
        ("seed1993", 0, 80.0),
        ("seed1993", 1, 70.0),
        ("seed5", 0, 100.0),
        ("seed5", 1, 90.0),
    ]
    # orders 75 and 95: (MS_between 400 - MS_within 50) / 2 = 175; seeds: 50
    assert spread(last) == f"orders sd {175**0.5:.1f}\nseeds sd {50**0.5:.1f}"
    items = build_report(tmp_path, tmp_path / "out", only=["fig_class_orders", "fig_accuracy_curves"])
    (figure,) = [item for item in items if item.name == "fig_class_orders"]
    png = tmp_path / "out" / "figures" / "fig_class_orders.png"
    assert figure.paths[0] == png and png.stat().st_size > 0
    assert "![fig_class_orders](figures/fig_class_orders.png)" in (tmp_path / "out" / "report.md").read_text()
    one = tmp_path / "one-order"
    store_run(one, "mine", "seed1993", 0, PERFECT)
    store_run(one, "gr4cil", "seed1993", 0, PERFECT)
    assert order_frame(load_inputs(one).every_order).empty
    items = build_report(one, tmp_path / "out-one", only=["fig_class_orders", "fig_accuracy_curves"])
    assert [item.name for item in items if item.kind == "figure"] == [
        "fig_accuracy_curves"
    ]  # not even a note
    assert "class_orders" not in (tmp_path / "out-one" / "report.md").read_text()


def test_reproducibility_reads_the_default_order_alone(tmp_path):
    from analysis.reproducibility import reproducibility_markdown

    for (label, order), flips in FLIPS.items():
        for seed, flip in enumerate(flips):
            store_run(
                tmp_path / "smoke-baselines", label, order, seed, _flip(PERFECT, flip), dataset="synthetic"
            )
    # one suite's folder, as runs/SUITE: every run of it counts (these 2-task runs are none of the
    # shipped smoke-baselines' runs, which a folder of suites' folders would count alone)
    text = reproducibility_markdown(tmp_path / "smoke-baselines")
    (row,) = [line for line in text.splitlines() if line.startswith("| `gr4cil`")]
    # gr4cil in seed1993: Last 60 and 70, Avg (100 + 60) / 2 = 80 and (100 + 70) / 2 = 85; seed5 left out
    assert "miniature 82.50 ± 2.50 / 65.00 ± 5.00 (n = 2)" in row


def test_n_is_said_as_orders_times_seeds():
    assert units_phrase([Unit("", 0), Unit("", 1), Unit("s5", 0), Unit("s5", 1)]) == "2 orders × 2 seeds"
    assert units_phrase([Unit("", 0), Unit("s5", 0), Unit("s5", 1), Unit("s7", 2)]) == "3 orders × 1–2 seeds"
    assert units_phrase([Unit("s5", 3)]) == "1 order × 1 seed"
