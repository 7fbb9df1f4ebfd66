"""tests/official/margins.py measures what docs/baselines.md says of the loops' margins."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.official.loop_helpers import MARGIN

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_margins_plugin_reports_each_loops_nearest_share_of_a_tolerance():
    said = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/official/test_magmax_loop.py", "-q", "-n", "0"]
        + ["-p", "no:cacheprovider", "-p", "tests.official.margins", "-k", "not perturbation"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert said.returncode == 0, said.stdout[-2000:]
    found = re.search(
        r"margins \(torch .*\): (\d+) quantities, the largest share of a tolerance ([0-9.]+)", said.stdout
    )
    assert found, said.stdout[-2000:]
    rows = re.findall(r"^  ([0-9.]+)  test_magmax_loop\.py  (\w+)$", said.stdout, flags=re.M)
    assert rows and int(found.group(1)) >= len(rows)
    shares = [float(share) for share, _ in rows]
    assert shares == sorted(shares, reverse=True) and shares[0] == float(found.group(2))
    assert 0 < shares[0] < MARGIN  # the loop passed, so every share is under the margin
