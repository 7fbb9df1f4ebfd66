"""Every command in a ```bash block of the README and of docs/ is checked, so the documents cannot
drift from the code. A ``python -m MODULE ...`` command goes through that module's own ``main``
until its arguments are parsed (nothing runs): the module exists, every flag exists and every value
parses, and a named suite exists. ``pytest`` commands name existing paths and declared markers;
``ruff`` commands need the project's ruff configuration, ``mypy`` its configured files. The offline
commands (the smoke, the tables, the report, the comparison) also run end to end in their own tests."""

import argparse
import importlib
import re
import shlex
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def bash_commands(path: Path) -> list[str]:
    """The commands of ``path``'s ```bash blocks, one per line (``&&`` splits a line)."""
    commands, inside = [], False
    for line in path.read_text().splitlines():
        if line.strip().startswith("```"):
            inside = not inside and line.strip() == "```bash"
            continue
        if inside and line.strip() and not line.strip().startswith("#"):
            commands += [part.strip() for part in line.split("&&")]
    return commands


COMMANDS = [
    (path.relative_to(ROOT).as_posix(), command) for path in DOCUMENTS for command in bash_commands(path)
]


class _Parsed(Exception):
    def __init__(self, namespace):
        self.namespace = namespace


def parsed_arguments(module: str, argv: list[str], monkeypatch) -> argparse.Namespace:
    """The namespace ``module``'s ``main`` parses from ``argv``; stops it right there. A package
    runs as ``python -m`` runs it: its ``__main__``."""
    real = argparse.ArgumentParser.parse_args
    entry = importlib.import_module(module)
    if hasattr(entry, "__path__"):
        entry = importlib.import_module(f"{module}.__main__")

    def parse_then_stop(self, args=None, namespace=None):
        raise _Parsed(real(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    with pytest.raises(_Parsed) as stopped:
        entry.main(argv)
    return stopped.value.namespace


def test_the_documents_have_commands():
    assert len(COMMANDS) > 20
    assert {path for path, _ in COMMANDS} >= {
        "README.md",
        "docs/running.md",
        "docs/cluster.md",
        "docs/miniature.md",
    }


@pytest.mark.parametrize("where, command", COMMANDS, ids=[f"{p}: {c[:60]}" for p, c in COMMANDS])
def test_a_documented_command_matches_the_code(where, command, monkeypatch):
    check_command(where, command, monkeypatch)


def check_command(where: str, command: str, monkeypatch) -> None:
    """Fail unless ``command`` parses as the code it names parses it (a loop or a SLURM job: the
    command it runs)."""
    if loop := re.fullmatch(r"for \w+ in [^;]+; do (.+?) &? ?done(; wait)?", command):
        return check_command(where, loop.group(1), monkeypatch)  # workers started side by side
    words = shlex.split(command)
    if words[0] == "sbatch":  # a job (array): the command it wraps
        return check_command(where, words[words.index("--wrap") + 1], monkeypatch)
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # an environment prefix, e.g. PYTHONPATH=...
        words.pop(0)
    tool = words[0]
    if words[:3] == ["python", "-m", "pytest"]:  # pytest with the checkout's root on sys.path
        tool, words = "python -m pytest", ["pytest", *words[3:]]
    if tool == "python" and words[1].endswith(".py"):  # a script of the checkout (.ci's): it exists
        assert (ROOT / words[1]).is_file(), command
    elif tool == "python":
        assert words[1] == "-m", command
        module, argv = words[2], words[3:]
        namespace = parsed_arguments(module, argv, monkeypatch)
        if getattr(namespace, "suite", None):
            from benchmarks.runner.suites import load_suite

            assert load_suite(namespace.suite)["name"]
    elif tool in ("pytest", "python -m pytest"):
        markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"][
            "markers"
        ]
        declared = {marker.split(":")[0] for marker in markers}
        argv = words[1:]
        for index, word in enumerate(argv):
            option = argv[index - 1] if index else None
            if option == "-m":
                assert set(re.findall(r"\w+", word)) - {"not", "and", "or"} <= declared, command
            elif option == "-p":  # a plugin of the checkout, named as a module
                assert (ROOT / (word.replace(".", "/") + ".py")).exists(), command
                # the pytest script does not put the checkout's root on sys.path; python -m does
                assert tool == "python -m pytest", f"{command}: python -m pytest finds the plugin"
            elif option in ("-k", "-n"):  # a test-name expression, a worker count
                continue
            elif not word.startswith("-"):
                assert (ROOT / word).exists(), command
    elif tool == "ruff":
        assert "ruff" in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
        assert words[1] in ("check", "format"), command
    elif tool == "mypy":  # the files it checks come from its configuration, each one present
        config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
        assert words == ["mypy"] and config["files"], command
        assert all((ROOT / path).exists() for path in config["files"]), config["files"]
    elif tool == "pip":
        extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
        if words[2] != "-e":  # PyTorch's own builds first, pinned inside the project's range
            assert words[1] == "install" and words[4] == "--index-url", command
            assert re.fullmatch(r"https://download\.pytorch\.org/whl/(cpu|cu\d+)", words[5]), command
            ranges = {
                Requirement(r).name: Requirement(r).specifier
                for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
            }
            pins = [Requirement(word) for word in words[2:4]]
            assert [pin.name for pin in pins] == ["torch", "torchvision"], command
            for pin in pins:
                (version,) = (spec.version for spec in pin.specifier)
                assert ranges[pin.name].contains(version), f"{command}: {pin} is outside the project's range"
            return
        assert words[1:3] == ["install", "-e"] and words[3] in (".", *(f".[{e}]" for e in extras)), command
    elif tool == "git":  # an outside framework's checkout: its repository, then a pinned commit
        assert (
            re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", words[2])
            if words[1] == "clone"
            else (words[1] == "-C" and words[3] == "checkout" and re.fullmatch(r"[0-9a-f]{7,40}", words[4]))
        ), command
    else:
        pytest.fail(f"{where}: a command this test does not know how to check: {command}")


def test_the_check_catches_a_misspelled_flag(monkeypatch):
    with pytest.raises(SystemExit):
        parsed_arguments("benchmarks.run", ["--suite", "smoke", "--worker-count", "4"], monkeypatch)


@pytest.mark.parametrize(
    "command",
    [
        "for worker in 1 2; do python -m benchmarks.tune --suite smoke --strategies gr4cil --space s.toml "
        "--trials 2 --trial-count 3 & done; wait",
        'sbatch --array=0-1 --wrap "python -m benchmarks.tune --suite smoke --strategies gr4cil '
        '--space s.toml --trials 2 --trial-count 3"',
    ],
)
def test_the_check_reads_the_command_a_loop_or_a_job_runs(command, monkeypatch):
    with pytest.raises(SystemExit):
        check_command("here", command, monkeypatch)


def test_a_script_command_names_a_script_of_the_checkout(monkeypatch):
    check_command("here", "python .ci/process_costs/summary.py /tmp/costs.jsonl", monkeypatch)
    with pytest.raises(AssertionError):
        check_command("here", "python .ci/process_costs/summarise.py /tmp/costs.jsonl", monkeypatch)
