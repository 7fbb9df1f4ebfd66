"""What the speed commands (``train_speed``, ``pipeline_speed``) share in reporting: where the numbers
come from (``machine``), a table's cells (``table_number``), the results printed and written
(``published``), and a measuring command's outcome (``outcome_of``)."""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.core.atomic_io import write_json
from benchmarks.tools.loader_speed import _cpu_count


def machine(device: str) -> dict:
    """Where the numbers come from: CPU count, torch threads and the device's name."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            name = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    if torch.device(device).type == "cuda":
        name = torch.cuda.get_device_name(torch.device(device))
    return {
        "cpu_count": _cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "device_name": name,
        # other processes on the same cores slow every number down: the 1-minute load when it starts
        "load_average": os.getloadavg()[0],
    }


def table_number(value: float | None, ratio: bool = False) -> str:
    """A table's cell: "-" for none, a ratio to two decimals, a rate in whole images (a small one to
    one decimal)."""
    if value is None:
        return "-"
    if ratio:
        return f"{value:.2f}"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def published(results: dict, table: str, out: str | None) -> dict:
    """``results`` with their Markdown ``table``, printed, and written as JSON to ``out`` if given."""
    results["table"] = table
    print(table)
    if out:
        write_json(Path(out), results)
    return results


def outcome_of(command: Callable[[list[str] | None], dict | int], argv: list[str] | None) -> dict:
    """A measuring command's results; a mistake in its input (the one-line error's exit code 2 from
    ``one_line_user_errors``) leaves as ``SystemExit``, as argparse does for a bad flag."""
    outcome = command(argv)
    if not isinstance(outcome, dict):
        raise SystemExit(outcome)
    return outcome
