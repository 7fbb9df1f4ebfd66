"""``benchmarks.tools.shared_cores``: each cell is a fresh smoke run at its thread count, idle or
beside a busy process, and the table names them all."""

import json

import pytest

from benchmarks.tools import shared_cores


@pytest.mark.slow
def test_every_cell_runs_the_suite_afresh_and_is_compared_with_the_idle_auto_one(tmp_path, capsys):
    out = tmp_path / "cells.json"
    argv = ["--threads", "auto", "--load", "idle,loaded", "--strategies", "continual_clip", "--out", str(out)]
    assert shared_cores.main(argv) == 0
    cells = json.loads(out.read_text())
    assert [(c["threads"], c["workers"], c["loaded"]) for c in cells] == [
        ("auto", "1", False),
        ("auto", "1", True),
    ]
    assert all(c["tasks"] == 10 and c["seconds"] > 0 for c in cells)  # nothing cached between cells
    rows = [
        line
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| idle") or line.startswith("| loaded")
    ]
    ratio = cells[1]["seconds"] / cells[0]["seconds"]
    assert rows == [
        f"| idle | auto | 1 | 1 | {cells[0]['seconds']:.0f} | 10 | 1.00 |",
        f"| loaded | auto | 1 | 1 | {cells[1]['seconds']:.0f} | 10 | {ratio:.2f} |",
    ]


def test_a_bad_thread_count_worker_count_or_load_is_one_line(capsys):
    assert shared_cores.main(["--threads", "auto,0"]) == 2
    assert shared_cores.main(["--workers", "1,none"]) == 2
    assert shared_cores.main(["--load", "busy"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and "threads must be a whole number" in err[0]
    assert "workers must be a whole number" in err[1] and "--load takes idle, loaded or both" in err[2]


def test_the_runs_at_once_are_read_from_what_the_command_says():
    # benchmarks.runner.local_launcher's line; a command without it ran inline, one run at a time
    local = "suite 'smoke': 5 run(s) -> runs\n2 local worker(s) share 5 run(s); each run's log: runs/.logs\n"
    assert shared_cores._workers_started(local) == 2
    inline = "suite 'smoke': 5 run(s) -> runs\nfinetune: ran; Avg 1  Last 1\n"
    assert shared_cores._workers_started(inline) == 1
