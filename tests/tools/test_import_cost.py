"""``python -m benchmarks.tools.import_cost``: one row per cell, the CPU seconds of real fresh
processes, the ratio to the running cell beside it; a bad count is one line."""

import pytest

from benchmarks.tools import import_cost


def test_each_cell_is_measured_in_fresh_processes_and_compared_with_the_running_one(capsys):
    assert import_cost.main(["--repeats", "2", "--modules", "json,decimal", "--runner", "fractions"]) == 0
    header, rule, *rows = capsys.readouterr().out.strip().splitlines()
    assert header.startswith("| imports | collector |") and len(rows) == 4
    cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]
    assert [(c[0], c[1], c[3]) for c in cells] == [
        ("reference (json,decimal)", "running", "2"),
        ("reference (json,decimal)", "paused, then frozen", "2"),
        ("fractions", "running", "2"),
        ("fractions", "paused, then frozen", "2"),
    ]
    assert all(0 < float(c[2]) < 30 for c in cells)  # a Python process's start, at least
    assert cells[0][4] == cells[2][4] == "1.00"


def test_the_table_gives_medians_and_each_paused_cells_ratio_to_its_running_one():
    seconds = {
        ("a", False): [1.0, 3.0, 2.0],
        ("a", True): [1.5, 1.0, 0.5],
        ("b", False): [4.0],
        ("b", True): [5.0],
    }
    assert import_cost.table(seconds).splitlines()[2:] == [
        "| a | running | 2.00 | 3 | 1.00 |",
        "| a | paused, then frozen | 1.00 | 3 | 0.50 |",
        "| b | running | 4.00 | 1 | 1.00 |",
        "| b | paused, then frozen | 5.00 | 1 | 1.25 |",
    ]


def test_a_module_that_cannot_be_imported_is_one_line(capsys):
    assert import_cost.main(["--repeats", "1", "--modules", "no_such_module_here"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert line.startswith("error: importing no_such_module_here failed") and "ModuleNotFoundError" in line


@pytest.mark.parametrize("repeats", ["0", "-1"])
def test_fewer_than_one_repeat_is_one_line(repeats, capsys):
    assert import_cost.main(["--repeats", repeats]) == 2
    assert "--repeats must be at least 1" in capsys.readouterr().err
