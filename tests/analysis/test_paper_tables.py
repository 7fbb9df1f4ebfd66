"""The paper tables split by job: inputs (``analysis.paper_inputs``), GR4CIL settings
(``analysis.gr4cil_settings``), the table model (``analysis.table_model``) and the builders
(``analysis.paper_tables``). The builders' numbers are tested end to end in ``test_report.py``."""

import importlib
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from analysis import paper_tables
from analysis.gr4cil_settings import (
    ABLATION_SWITCHES,
    effective_setting,
    gr4cil_defaults,
    matches,
    suite_setting,
)
from analysis.paper_inputs import load_paper_reference
from analysis.table_model import ReportTable
from benchmarks.runner.suites import load_suite
from tests.analysis.records import run_result

ROOT = Path(__file__).resolve().parents[2]

# Every public name of analysis.paper_tables before it was split, by the module that defines it now;
# the three derived constants of old are functions (GR4CIL_DEFAULTS: gr4cil_defaults, ABLATION_ROWS:
# ablation_rows, COMPENSATION_ROWS: compensation_rows).
NAMES_BEFORE_THE_SPLIT = {
    "analysis.paper_inputs": """
        DATASET_NAMES PAPER_DATASETS PAPER_METHOD_NAMES PAPER_ROW_ALIASES REFERENCE_FILE ROW_LABELS
        MissingInputs ReportInputs dataset_name load_inputs load_paper_reference match_paper_row
        ordered_datasets row_label
    """,
    "analysis.gr4cil_settings": """
        gr4cil_defaults default_gr4cil_runs differing_switches effective_setting gr4cil_setting matches
    """,
    "analysis.table_model": "LOWER_IS_BETTER METRIC_NAMES RenderedTable ReportTable",
    "analysis.paper_tables": """
        TABLES ZERO_SHOT_ROWS ZERO_SHOT_TARGETS ablation_rows compensation_rows table1_main
        table2_ood table2_seq table3_subspace table3_zeroshot table4_ablation table5_compensation
        table_adjacent_subspace table_anchor table_beta_gamma table_tau
    """,
}


def test_every_name_of_the_old_module_imports_from_the_module_that_defines_it():
    for module_name, names in NAMES_BEFORE_THE_SPLIT.items():
        module = importlib.import_module(module_name)
        for name in names.split():
            value = getattr(module, name)
            if callable(value):  # a function or class is defined there, not imported
                assert value.__module__ == module_name, (module_name, name)
    # no re-exports left in analysis.paper_tables, and no module __getattr__ computing old names
    assert not hasattr(paper_tables, "__getattr__") and not hasattr(paper_tables, "__all__")
    for name in ("load_inputs", "row_label", "GR4CIL_DEFAULTS", "ABLATION_ROWS", "COMPENSATION_ROWS"):
        assert not hasattr(paper_tables, name), name


@pytest.mark.slow  # another process
def test_importing_the_report_does_not_import_the_strategies():
    # The derived defaults and rows are read on first use: the analysis CLIs stay fast to start. The
    # methods' cards are read (plain data, strategies.cards), never a method.
    code = (
        "import sys, analysis.report, analysis.figures, analysis.paper_tables; "
        "assert not [m for m in sys.modules if m.startswith('strategies') "
        "and m not in ('strategies', 'strategies.cards')], sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_gr4cil_defaults_are_those_of_the_strategy_config():
    from strategies.methods.gr4cil import GR4CILConfig

    default = GR4CILConfig()
    assert gr4cil_defaults() == {name: getattr(default, name) for name in ABLATION_SWITCHES}


def test_paper_rows_are_the_suites_variants():
    # Tables 4 and 5 as the paper prints them, by the switches that differ from the full model;
    # the suite files must keep defining them (compared as effective settings).
    table4 = {
        "Base": {
            "use_anchor_loss": False,
            "use_separation_loss": False,
            "compensation": "off",
            "use_prototype_score": False,
        },
        "+ L_anc and L_sep": {"compensation": "off", "use_prototype_score": False},
        "+ Compensation term": {"use_prototype_score": False},
        "+ Prototype term (Full model)": {},
    }
    table5 = {
        "Orth ×, Proto ×": {"compensation": "unconstrained", "compensation_init": "random"},
        "Orth ✓, Proto ×": {"compensation": "orthogonal", "compensation_init": "random"},
        "Orth ×, Proto ✓": {"compensation": "unconstrained", "compensation_init": "prototype"},
        "Orth ✓, Proto ✓": {},
    }
    defaults = gr4cil_defaults()
    for expected, derived in (
        (table4, paper_tables.ablation_rows()),
        (table5, paper_tables.compensation_rows()),
    ):
        assert list(derived) == list(expected)  # the paper's row order
        for row, overrides in expected.items():
            assert effective_setting({**defaults, **derived[row]}) == effective_setting(
                {**defaults, **overrides}
            )
    assert suite_setting(*paper_tables.WITHOUT_LOSSES_RUN) == {
        "use_anchor_loss": False,
        "use_separation_loss": False,
    }
    labels = {*paper_tables.ABLATION_RUNS.values(), *paper_tables.COMPENSATION_RUNS.values()}
    assert labels <= set(load_suite("ablation")["strategies"])


def test_suite_setting_reads_the_suite_as_the_runner_resolves_it(tmp_path):
    suite = tmp_path / "my-ablation.toml"
    suite.write_text(
        'datasets = ["synthetic"]\ntasks = [2]\nseeds = [0]\nstrategies = ["gr4cil", "no-sep"]\n'
        "[strategy.gr4cil]\nepochs = 1\ntau = 0.6\n"  # a switch set for every GR4CIL run of the suite
        '[variants.no-sep]\nstrategy = "gr4cil"\nuse_separation_loss = false\nlr = 0.1\n'
    )
    assert suite_setting(str(suite), "gr4cil") == {"tau": 0.6}  # recipe options (epochs, lr) are no switch
    assert suite_setting(str(suite), "no-sep") == {"tau": 0.6, "use_separation_loss": False}


def test_a_disabled_component_ignores_its_switches():
    run = run_result("gr4cil", config={"strategy_config": {"use_separation_loss": False, "tau": 0.3}})
    assert matches(run, {"use_separation_loss": False})  # tau means nothing without L_sep
    assert not matches(run, {})
    assert not matches(run_result("finetune"), {})


def test_a_table_renders_paper_rows_differences_and_marks():
    samples = pd.DataFrame(
        [
            ("gr4cil", "cifar100", "avg_acc", 0, 80.0),
            ("gr4cil", "cifar100", "avg_acc", 1, 82.0),
            ("my_method", "cifar100", "avg_acc", 0, 70.0),
        ],
        columns=["row", "group", "metric", "seed", "value"],
    )
    table = ReportTable(
        "table1_main", "A title.", samples, ["gr4cil", "my_method"], [("cifar100", "avg_acc")]
    )
    rendered = table.render(load_paper_reference())
    rows = {name: (kind, cells, marks) for name, kind, cells, marks in rendered.rows}
    assert rows["GR4CIL"] == ("reproduced", ["81.00 ± 1.00"], ["best"])
    assert rows["my_method"] == ("reproduced", ["70.00 (n = 1)"], ["second"])
    assert rows["GR4CIL (Ours) [paper]"][:2] == ("paper", ["89.35 ± 0.26"])
    assert rows["GR4CIL Δ"][:2] == ("delta", ["-8.35"])
    assert "**81.00 ± 1.00**" in rendered.to_markdown() and "\\textbf{" in rendered.to_latex()
    assert rendered.to_csv().splitlines()[0] == "method,kind,CIFAR-100 Avg-Acc"
