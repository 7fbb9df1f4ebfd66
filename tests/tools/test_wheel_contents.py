"""The installed package leaves out the official goldens' generation, which lives beside the tests
that read its fixtures (``tests/official/goldens/``, docs/baselines.md §16): the wheel built from
this tree holds no test, and no module that is installed imports the goldens."""

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("benchmarks", "strategies", "analysis")
GOLDENS = "tests.official.goldens"


@pytest.mark.slow
def test_the_wheel_holds_the_package_but_not_the_golden_generation(tmp_path):
    source = tmp_path / "source"
    for package in PACKAGES:  # a copy: setuptools writes build/ and *.egg-info beside the sources
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    # built as `pip install .` builds it, in an isolated environment with pyproject's setuptools: a fresh
    # venv's own (3.11: setuptools 65, no bdist_wheel) cannot build it
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", "dist", "."],
        cwd=source,
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (source / "dist").glob("*.whl")
    shipped = zipfile.ZipFile(wheel).namelist()
    assert not [name for name in shipped if name.startswith("tests/") or "goldens" in name]
    # what the wheel must hold: the tools and the packages' data
    for kept in ("benchmarks/tools/speed.py", "benchmarks/tools/__init__.py", "strategies/registry.py"):
        assert kept in shipped
    assert any(name.startswith("benchmarks/suites/") and name.endswith(".toml") for name in shipped)
    assert "strategies/methods/gr4cil.toml" in shipped  # each method's card beside its file


def _imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports (at the top or inside a function), and every string constant
    that names a module of the goldens (an ``importlib.import_module`` argument)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
        elif isinstance(node, ast.Constant) and str(node.value).startswith(GOLDENS):
            found.add(node.value)
    return found


def test_no_installed_module_imports_the_golden_generation():
    installed = [path for package in PACKAGES for path in (ROOT / package).rglob("*.py")]
    assert len(installed) > 50
    importers = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in installed
        for module in sorted(_imported_modules(path))
        if module == GOLDENS or module.startswith(GOLDENS + ".")
    ]
    assert not importers, "\n".join(importers)


def test_the_check_finds_an_import_of_the_goldens(tmp_path):
    """The checker itself: an import inside a function, and a module named by string, are found."""
    path = tmp_path / "probe.py"
    path.write_text(
        "import importlib\n\n\ndef f():\n"
        "    from tests.official.goldens.golden import load_golden\n"
        "    return importlib.import_module('tests.official.goldens.clap4clip_repo')\n"
    )
    assert {
        "tests.official.goldens.golden",
        "tests.official.goldens.clap4clip_repo",
    } <= _imported_modules(path)
