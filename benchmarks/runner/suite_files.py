"""Where suites live and which file a ``--suite`` names, importing nothing heavy: a misspelt suite
is one line before torch is imported (``benchmarks.run``)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.core.errors import UserError

SUITES_DIR = Path(__file__).parents[1] / "suites"


def available_suites() -> list[str]:
    return sorted(p.stem for p in SUITES_DIR.glob("*.toml"))


def suite_file(name_or_path: str) -> Path:
    """The file of a suite named ``name_or_path`` (``benchmarks/suites/NAME.toml``), or the
    ``.toml`` file at that path; one line for anything else."""
    path = Path(name_or_path)
    if path.suffix == ".toml" and path.is_dir():
        raise UserError(
            f"--suite {name_or_path}: is a folder, not a suite file; give the path of a .toml file"
        )
    if not (path.suffix == ".toml" and path.exists()):
        path = SUITES_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        raise UserError(
            f"unknown suite {name_or_path!r}; available: {', '.join(available_suites())}, "
            "or give a path to a .toml file"
        )
    return path
