"""How near each unperturbed training loop comes to its tolerances, as a share of each: a pytest
plugin for measuring the margins docs/baselines.md gives, on any machine or torch build:

    python -m pytest tests/official -k "loop or loops" -n 0 -p tests.official.margins

(``python -m``: the checkout's root on the path, where ``-p`` finds the plugin.)

It records every quantity that ``loop_helpers.beyond_margin`` judges (the unperturbed loops only) and
prints the nearest at the end. Loaded with ``-p``, it wraps ``beyond_margin`` before any test module
imports it.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import torch

from tests.official import loop_helpers

SHOWN = 6
_shares: dict[tuple[str, str], float] = {}
_judge = loop_helpers.beyond_margin


def _recording(diffs: dict[str, float], tolerances: dict[str, float]) -> dict[str, float]:
    test_file = Path(inspect.stack()[1].filename).name
    for name, diff in diffs.items():
        if tolerance := tolerances.get(name, 0.0):
            key = (test_file, name)
            _shares[key] = max(_shares.get(key, 0.0), diff / tolerance)
    return _judge(diffs, tolerances)


loop_helpers.beyond_margin = _recording


def pytest_terminal_summary(terminalreporter) -> None:
    if not _shares:
        terminalreporter.write_line("margins: no loop compared (run tests/official with -n 0)")
        return
    nearest = sorted(_shares.items(), key=lambda item: -item[1])[:SHOWN]
    terminalreporter.write_line(
        f"margins (torch {torch.__version__}): {len(_shares)} quantities, the largest share of a "
        f"tolerance {nearest[0][1]:.3f} (a loop passes below {loop_helpers.MARGIN})"
    )
    for (test_file, name), share in nearest:
        terminalreporter.write_line(f"  {share:.3f}  {test_file}  {name}")
