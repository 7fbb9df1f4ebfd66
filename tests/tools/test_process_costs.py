"""CI's process-cost log (``.ci/process_costs``): each Python process started with it on the path
writes one line, attributed to the test that started it, and the summary adds them up."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COSTS = ROOT / ".ci" / "process_costs"


def _summary_module():
    spec = importlib.util.spec_from_file_location("process_costs_summary", COSTS / "summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_process_writes_one_line_with_the_test_that_started_it(tmp_path):
    log = tmp_path / "costs.jsonl"
    env = {**os.environ, "PYTHONPATH": str(COSTS), "CI_PROCESS_COSTS": str(log)}
    env.pop("PYTEST_CURRENT_TEST", None)
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
    busy = "import time; end = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    env["PYTEST_CURRENT_TEST"] = "tests/x.py::test_y (call)"
    subprocess.run([sys.executable, "-c", busy], env=env, check=True)
    subprocess.run([sys.executable, "-c", "import os; os._exit(0)"], env=env, check=True)  # no atexit
    own, started = [json.loads(line) for line in log.read_text().splitlines()]
    assert own["test"] is None and not own["avalanche"]
    assert started["test"] == "tests/x.py::test_y" and started["cpu_s"] >= 0.3
    assert started["wall_s"] >= started["cpu_s"] - 0.05  # one thread: no more CPU than wall time


def test_the_summary_adds_each_tests_processes():
    lines = [
        {"argv": ["-m"], "wall_s": 9.0, "cpu_s": 8.0, "avalanche": True, "test": None},
        {"argv": ["-c"], "wall_s": 3.0, "cpu_s": 2.5, "avalanche": True, "test": "t::a"},
        {"argv": ["-c"], "wall_s": 2.0, "cpu_s": 1.5, "avalanche": False, "test": "t::a"},
        {"argv": ["-c"], "wall_s": 6.0, "cpu_s": 5.0, "avalanche": True, "test": "t::b"},
    ]
    text = _summary_module().summarise(lines)
    assert "pytest's own processes: 1, 8 s of CPU" in text
    assert "processes the tests started: 3 from 2 tests, 9 s of CPU; 2 imported Avalanche (8 s)" in text
    assert text.index("| 5.0 | 1 | t::b |") < text.index("| 4.0 | 2 | t::a |")  # heaviest first
