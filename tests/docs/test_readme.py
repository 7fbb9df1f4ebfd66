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
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert commands[0] in ci and commands[1] in ci
    assert ci.index(commands[0]) < ci.index(commands[1])
