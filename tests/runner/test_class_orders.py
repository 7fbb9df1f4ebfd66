"""The class order as a variance axis (issue 59, item 5): a suite that lists several orders runs
each (order, seed), stores every order but its protocol's default under ``-order-<name>``, and
every reader, tool and view of the store finds those files."""

import json

import pytest

from benchmarks import run
from benchmarks.core.errors import UserError
from benchmarks.runner import status
from benchmarks.runner.building import resolve
from benchmarks.runner.reading import read_results
from benchmarks.runner.results import RESULT_NAME, ResultStore, RunKey
from benchmarks.runner.suites import expand, load_suite
from benchmarks.tools import kill_rerun
from tests.helpers import MINI_SUITE, tiny_suite, write_suite

TWO_ORDERS = 'class_order = ["seed1993", "seed0"]\n' + MINI_SUITE.replace("seeds = [0]", "seeds = [0, 1]")
pytestmark = pytest.mark.spread


def _suite(tmp_path, text: str) -> dict:
    return load_suite(write_suite(tmp_path / "suite.toml", text))


def test_several_orders_make_one_run_per_order_and_seed_and_the_default_keeps_its_name(tmp_path):
    runs = expand(_suite(tmp_path, TWO_ORDERS))
    got = [(r.label, r.class_order, r.seed, r.config["class_order"], r.key.stem) for r in runs]
    assert got == [
        (label, order, seed, order, stem)
        for label in ("continual_clip", "finetune")
        for order, seed, stem in (
            ("seed1993", 0, "T5-seed0"),
            ("seed1993", 1, "T5-seed1"),
            ("seed0", 0, "T5-seed0-order-seed0"),
            ("seed0", 1, "T5-seed1-order-seed0"),
        )
    ]
    store = ResultStore(tmp_path / "results")
    paths = {store.result_path(r.key).relative_to(store.root).as_posix() for r in runs}
    assert "synthetic/finetune/T5-seed1-order-seed0.json" in paths and len(paths) == 8
    assert all(RESULT_NAME.fullmatch(path.rsplit("/", 1)[1]) for path in paths)
    assert str(runs[2].key) == "continual_clip / synthetic / 5 tasks / seed 0 / order seed0"
    # the default order's runs are those of the one-order suite, config and hash alike
    single = {(r.label, r.seed): r for r in expand(_suite(tmp_path, MINI_SUITE.replace("[0]", "[0, 1]")))}
    for spec in (r for r in runs if r.class_order == "seed1993"):
        assert spec.config == single[spec.label, spec.seed].config
        assert resolve(spec, ".").config_hash == resolve(single[spec.label, spec.seed], ".").config_hash
    assert len({resolve(r, ".").config_hash for r in runs}) == 8


def test_a_strategy_table_may_list_orders_for_its_runs_alone(tmp_path):
    text = MINI_SUITE.replace(
        "[strategy.finetune]\n", '[strategy.finetune]\nclass_order = ["seed1993", "seed7"]\n'
    )
    runs = expand(_suite(tmp_path, text))
    assert [(r.label, r.class_order) for r in runs] == [
        ("continual_clip", "seed1993"),
        ("finetune", "seed1993"),
        ("finetune", "seed7"),
    ]
    assert all("class_order" not in r.config["strategy_options"] for r in runs)
    assert "class_order" not in runs[2].option_sources


def test_the_command_lines_orders_override_every_table(tmp_path):
    args = run.parse_args(["--class-order", "seed1993,seed5"])
    assert args.class_order == ["seed1993", "seed5"]
    text = MINI_SUITE.replace("[strategy.finetune]\n", '[strategy.finetune]\nclass_order = "seed7"\n')
    runs = expand(_suite(tmp_path, text), class_order=args.class_order)
    assert [(r.label, r.class_order, r.key.order) for r in runs] == [
        ("continual_clip", "seed1993", ""),
        ("continual_clip", "seed5", "seed5"),
        ("finetune", "seed1993", ""),
        ("finetune", "seed5", "seed5"),
    ]
    # the table's own order no longer stays behind among the strategy's options
    assert all("class_order" not in r.config["strategy_options"] for r in runs)
    assert [r.class_order for r in expand(_suite(tmp_path, MINI_SUITE), class_order="seed3")] == ["seed3"] * 2


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ('class_order = ["seed0", "seed0"]', "names an order twice"),
        ("class_order = []", "must be an order name or a list"),
        ("class_order = [1993]", "must be an order name or a list"),
    ],
)
def test_a_bad_list_of_orders_is_one_line(tmp_path, line, said):
    with pytest.raises(UserError, match=f"class_order \\(the suite's\\) {said}"):
        expand(_suite(tmp_path, line + "\n" + MINI_SUITE))


def test_an_empty_or_repeated_class_order_flag_is_refused_in_one_line(tmp_path, capsys):
    suite = write_suite(tmp_path / "suite.toml", MINI_SUITE)
    for value, said in (("", "must be an order name"), ("seed1,seed1", "names an order twice")):
        argv = ["--suite", suite, "--results-dir", str(tmp_path / "r"), "--class-order", value, "--dry-run"]
        assert run.main(argv) == 2
        assert f"class_order (--class-order) {said}" in capsys.readouterr().err


def test_dry_run_names_each_order(tmp_path, capsys):
    suite = write_suite(tmp_path / "suite.toml", TWO_ORDERS)
    assert run.main(["--suite", suite, "--results-dir", str(tmp_path / "r"), "--dry-run"]) == 0
    rows = [line.split(" | ")[0].strip("| ") for line in capsys.readouterr().out.splitlines()]
    assert "finetune / synthetic / 5 tasks / seed 1 / order seed0" in rows
    assert "finetune / synthetic / 5 tasks / seed 1" in rows  # the default order, as it has always read


def _stored(store: ResultStore, key: RunKey, order: str, last: float) -> None:
    """A finished hand-made result of ``key`` in class order ``order``."""
    stage = {
        "task": 1,
        "acc": last,
        "acc_per_task": [last],
        "n_test_per_task": [4],
        "routing_acc": 100.0,
        "auroc": None,
        "fpr95": None,
        "diagnostics": {},
    }
    config = {
        "strategy": key.label,
        "dataset": key.dataset,
        "n_tasks": 1,
        "seed": key.seed,
        "class_order": order,
    }
    result = {
        "schema_version": 5,
        "strategy": key.label,
        "label": key.label,
        "dataset": key.dataset,
        "n_tasks": 1,
        "seed": key.seed,
        "config": config,
        "class_order": [0, 1],
        "tasks": [[0, 1]],
        "stages": [stage],
        "summary": {"avg_acc": last, "last_acc": last},
        "env": {},
        "cost": {},
    }
    store.save(key, result)


def test_status_readers_and_tools_find_every_orders_files(tmp_path):
    store = ResultStore(tmp_path)
    default, other = (
        RunKey("finetune", "synthetic", 1, 0),
        RunKey("finetune", "synthetic", 1, 0, order="seed5"),
    )
    _stored(store, default, "seed1993", 50.0)
    _stored(store, other, "seed5", 40.0)
    assert store.result_path(other).name == "T1-seed0-order-seed5.json"
    assert {file.key for file in read_results(tmp_path).runs} == {default, other}
    assert status.known_runs(store) == [default, other]
    table = status.status_table(store)
    assert (
        "| finetune / synthetic / 1 tasks / seed 0 / order seed5 | finished | Avg 40.00  Last 40.00 |"
        in table
    )
    assert "| finetune / synthetic / 1 tasks / seed 0 | finished | Avg 50.00" in table
    names = [path.name for path in kill_rerun._result_files(tmp_path)]
    assert names == ["T1-seed0-order-seed5.json", "T1-seed0.json"]
    (tmp_path / "synthetic" / "finetune" / "model.json").write_text(json.dumps({}))  # not a result
    assert len(kill_rerun._result_files(tmp_path)) == 2


@pytest.mark.slow
def test_two_orders_run_end_to_end_then_compare_tables_and_figure(tmp_path, capsys):
    """A tiny suite of 2 orders x 2 seeds (Continual-CLIP, and fine-tuning for one epoch) run, then
    compared, tabled and drawn."""
    from analysis import compare
    from analysis.report import build_report
    from analysis.tables import accuracy_table, load_runs

    text = (
        'class_order = ["seed1993", "seed0"]\n'
        + tiny_suite(["continual_clip", "finetune"], tasks=2, seeds=(0, 1))
        + "[dataset.synthetic]\nn_classes = 10\nn_train_per_class = 6\nn_test_per_class = 4\n"
        + "[defaults]\nbatch_size = 32\neval_batch_size = 200\nlora_rank = 2\nlora_alpha = 2.0\n"
        + "[strategy.finetune]\nepochs = 1\n"
    )
    suite, results = write_suite(tmp_path / "suite.toml", text), tmp_path / "results"
    assert run.main(["--suite", suite, "--results-dir", str(results), "--quiet"]) == 0
    names = sorted(p.name for p in (results / "synthetic" / "finetune").glob("*.json"))
    assert names == [
        "T2-seed0-order-seed0.json",
        "T2-seed0.json",
        "T2-seed1-order-seed0.json",
        "T2-seed1.json",
    ]
    stored = {(r.config["class_order"], r.seed): r for r in (f.result for f in read_results(results).runs)}
    assert len(stored) == 4 and stored["seed0", 1].key.order == "seed0"
    assert stored["seed0", 0].class_order != stored["seed1993", 0].class_order  # the permutations differ
    assert status.status_table(ResultStore(results)).endswith("8 finished")
    capsys.readouterr()
    argv = ["--results-dir", str(results), "--baseline", "continual_clip", "--draws", "200"]
    assert compare.main(argv) == 0
    out = capsys.readouterr().out
    assert (
        "(n = 2 orders × 2 seeds)" in out
        and "seed1993: 0, 1; seed0: 0, 1" in out
        and "## By class order" in out
    )
    columns = set(accuracy_table(load_runs(results)).columns.get_level_values(0))
    assert columns == {"synthetic (order seed1993)", "synthetic (order seed0)"}
    items = build_report(results, tmp_path / "report", with_paper=False, only=["fig_class_orders"])
    assert (tmp_path / "report" / "figures" / "fig_class_orders.png") in items[0].paths
