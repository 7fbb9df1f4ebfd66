"""The README's first two commands are exactly what CI runs."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_starts_with_the_two_commands_ci_runs():
    readme = (ROOT / "README.md").read_text().splitlines()
    fence = readme.index("```bash")
    commands = readme[fence + 1 : fence + 3]
    assert fence <= 3 and readme[fence + 3] == "```"
    assert commands[0].endswith("python -m benchmarks.run --suite smoke")
    assert commands[1].endswith("pytest")
    # CI runs each part of each command (``a && b``) as a whole command, in the README's order; a part
    # may stand on its own line, where CI does something between two parts (mypy beside the tests)
    ci = [
        part.strip()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        for part in line.split(" && ")
    ]
    remaining = iter(ci)  # ``in`` consumes it: each part is looked for after the one before
    for part in (part for command in commands for part in command.split(" && ")):
        assert part in remaining, f"CI does not run {part!r} after the README's earlier parts"


def test_the_pre_commit_hooks_run_the_checks_ci_runs():
    """Each hook is one of CI's checks, with CI's pinned tools (local hooks, the environment's ruff
    and mypy), and every check CI runs after the tests has its hook; mypy checks the configured
    files, not the files a commit touches (so no hook passes a file list to it)."""
    import yaml

    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = [hook for repo in config["repos"] for hook in repo["hooks"]]
    assert [repo["repo"] for repo in config["repos"]] == ["local"]
    assert all(hook["language"] == "system" for hook in hooks)
    ci = (ROOT / ".ci" / "run").read_text()
    entries = {hook["id"]: hook["entry"].split() for hook in hooks}
    assert entries == {
        "ruff-check": ["ruff", "check", "--force-exclude"],
        "ruff-format": ["ruff", "format", "--force-exclude"],
        "mypy": ["mypy"],
    }
    assert "ruff check . && ruff format --check ." in ci and '\nmypy > "$mypy_log" 2>&1 &\n' in ci
    assert next(hook for hook in hooks if hook["id"] == "mypy")["pass_filenames"] is False
