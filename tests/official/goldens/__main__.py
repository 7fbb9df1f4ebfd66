"""``python -m tests.official.goldens --official-root DIR [--components a,b] [--out DIR]``."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tqdm.auto import tqdm

from benchmarks.core.errors import CommandParser, UserError, one_line_user_errors
from tests.official.goldens import components
from tests.official.goldens.golden import FIXTURES, save_golden


@one_line_user_errors
def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="python -m tests.official.goldens", description=__doc__)
    parser.add_argument("--official-root", help="folder of the official checkouts (required unless --list)")
    parser.add_argument("--components", help="comma-separated subset (default: all)")
    parser.add_argument("--out", default=str(FIXTURES), help=f"fixture folder (default {FIXTURES})")
    parser.add_argument("--list", action="store_true", help="list the components and their sources")
    args = parser.parse_args(argv)
    registry = components()
    if args.list:
        for name, (official, _) in registry.items():
            print(f"{name}\t{official.repository}@{official.commit[:12]}\t{official.folder}")
        return 0
    names = args.components.split(",") if args.components else list(registry)
    unknown = [name for name in names if name not in registry]
    if unknown:
        raise UserError(f"unknown component(s) {', '.join(unknown)}; --list shows them")
    if not args.official_root:
        raise UserError("give --official-root DIR, the folder of the official checkouts")
    root = Path(args.official_root)
    if not root.is_dir():
        raise UserError(f"--official-root {root} is not a folder")
    checkouts = {name: registry[name].official.checkout(root) for name in names}  # every one, before any runs
    for name in (progress := tqdm(names, desc="official goldens", unit="component")):
        progress.set_postfix(component=name)
        torch.manual_seed(0)  # a component that draws from the global generator draws the same
        golden = registry[name].make(checkouts[name])
        if golden.component != name:
            raise RuntimeError(f"{name}'s generator returned {golden.component!r}")
        save_golden(golden, Path(args.out))
    print(f"{len(names)} fixture(s) in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
