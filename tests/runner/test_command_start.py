"""Commands start without what they do not need: ``benchmarks.run --help``, a refused option and a
misspelt suite answer from the parser alone, and the analysis commands never load Avalanche or
open_clip. Checked by the modules a fresh process imports (``python -X importtime``), not by a
clock."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]

HEAVY = {"torch", "torchvision", "avalanche", "open_clip", "numpy", "sklearn", "pandas"}


def imported(*argv: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """The finished command and the top-level packages it imported."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    names = {
        line.split("|")[2].strip().split(".")[0]
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "cumulative" not in line
    }
    return done, names


def test_run_help_imports_nothing_heavy():
    done, names = imported("benchmarks.run", "--help")
    assert done.returncode == 0
    assert "--fast-dev-run" in done.stdout and "python -m benchmarks.tools.gpu_check" in done.stdout
    assert names & HEAVY == set()


def test_tune_help_imports_nothing_heavy():
    done, names = imported("benchmarks.tune", "--help")
    assert done.returncode == 0
    assert "{val_avg,val_last}" in done.stdout and "else 0.1)" in done.stdout
    assert names & (HEAVY | {"optuna"}) == set()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--precision", "fp64"], "argument --precision: invalid choice: 'fp64'"),
        (["--launcher", "k8s"], "argument --launcher: invalid choice: 'k8s'"),
        (["--seeds", "1,x"], "argument --seeds: expected a comma-separated list"),
        (["--fast-dev-run", "two"], "argument --fast-dev-run: invalid int value"),
        (["--suite", "smoek"], "error: unknown suite 'smoek'; available: "),
    ],
)
def test_a_refused_option_is_one_line_before_torch(argv, message):
    done, names = imported("benchmarks.run", *argv)
    _one_line_without_torch(done, names, message)


TUNE = ["--strategies", "finetune", "--space", "space.toml", "--trials", "2"]
# the suite and the space file read, a strategy's name and the space's tables checked: still no torch
SPACE = ["--space", "examples/tuning/smoke-baselines-space.toml", "--trials", "2"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--suite", "smoke", *TUNE, "--objective", "val_best"], "argument --objective: invalid choice"),
        (["--suite", "smoke", *TUNE[:-1], "0"], "a trial budget is a whole number >= 1, not '0'"),
        (["--suite", "smoek", *TUNE], "error: unknown suite 'smoek'; available: "),
        (["--suite", "smoke", *TUNE, "--validation-fraction", "0.9"], "a fraction in (0, 0.5], not '0.9'"),
        (["--suite", "smoke", *TUNE, "--validation-seed", "-1"], "a whole number >= 0, not '-1'"),
    ],
)
def test_a_refused_tune_option_is_one_line_before_torch(argv, message):
    _one_line_without_torch(*imported("benchmarks.tune", *argv), message)


def _one_line_without_torch(done, names, message, heavy=HEAVY):
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    assert len(errors) == 1 and message in errors[0], errors
    assert names & heavy == set()


TORCH_AND_UP = {"torch", "torchvision", "avalanche", "open_clip", "peft", "sklearn"}


@pytest.mark.parametrize(
    "command", ["analysis.tables", "analysis.compare", "benchmarks.runner.status", "benchmarks.prepare"]
)
def test_reading_results_and_prepare_never_load_torch(command):
    done, names = imported(command, "--help")
    assert done.returncode == 0
    assert names & TORCH_AND_UP == set()


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--strategies", "gr4cl"],
            "error: unknown strategy 'gr4cl'; did you mean 'gr4cil'? available: adaptervlm, ",
        ),
        (["--strategies", "finetune,gr4cl"], "error: unknown strategy 'gr4cl'; did you mean"),
        # a known name goes on: the dry run resolves each run against its strategy's config (torch
        # and Avalanche) and checks its weights offline, without open_clip
        (["--datasets", "synthetic"], None),
    ],
)
def test_a_misspelt_strategy_is_one_line_before_torch(argv, message, tmp_path):
    """The suite is read and each run's strategy name checked against the methods' files before a
    method, torch or Avalanche is imported (a dry run of a known one does import them)."""
    done, names = imported(
        "benchmarks.run", "--suite", "smoke", *argv, "--dry-run", "--results-dir", str(tmp_path)
    )
    if message is None:
        assert done.returncode == 0 and {"torch", "avalanche"} <= names and "open_clip" not in names
        # imported under heavy_imports, frozen, unfrozen at exit: else qpsolvers' nanobind modules
        # (Avalanche's GEM) print "nanobind: leaked ..." for each of their objects still frozen
        assert "nanobind: leaked" not in done.stderr, done.stderr[-2000:]
        return
    errors = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    assert done.returncode == 2 and len(errors) == 1 and message in errors[0], errors
    assert names & TORCH_AND_UP == set()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tasks", "x"], "error: --tasks: tasks must be whole numbers or splits B<m>-Inc<n> (n >= 1)"),
        (["--tasks", "0"], "error: --tasks: task counts must be >= 1; got [0]"),
        (["--seeds", "4294967296"], "error: --seeds must be whole numbers from 0 to 4294967295"),
        (["--datasets", ""], "error: --datasets is empty; name at least one (e.g. --datasets synthetic)"),
    ],
)
def test_a_slip_in_the_rows_chosen_is_one_line_before_torch(argv, message):
    """--tasks, --seeds and an empty list are checked once the suite is read, before any run is
    resolved (it was after Avalanche's import: 18 s for a typo)."""
    done, names = imported("benchmarks.run", "--suite", "smoke", *argv)
    _one_line_without_torch(done, names, message, heavy=TORCH_AND_UP)  # the suite's read needs numpy


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--suite", "smoke", "--strategies", "gr4ci"], "unknown strategy 'gr4ci'; did you mean 'gr4cil'?"),
        (["--suite", "smoke-baselines", "--strategies", "finetune"], "has no [finetune] table"),
        (["--suite", "smoke", "--strategies", "gr4cil"], "has table(s) ['moe4cl'] for no row"),
    ],
)
def test_a_slip_in_a_tune_s_names_or_space_tables_is_one_line_before_torch(argv, message):
    """The suite is loaded, each name checked and the space file's tables matched to the suite's rows
    before a method, torch or Avalanche is imported (a field's check reads its strategy's Config)."""
    done, names = imported("benchmarks.tune", *argv, *SPACE)
    errors = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    assert done.returncode == 2 and len(errors) == 1 and message in errors[0], errors
    assert names & TORCH_AND_UP == set()
