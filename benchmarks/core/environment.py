"""What a run records about where it ran, and helpers for seeding and peak memory."""

from __future__ import annotations

import os
import platform
import random
import resource
import socket
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from benchmarks.core.errors import UserError

PACKAGES = (
    "torch",
    "torchvision",
    "open_clip_torch",
    "peft",
    "avalanche-lib",
    "numpy",
    "scikit-learn",
    "safetensors",
    "pandas",
)
REPO_ROOT = Path(__file__).resolve().parents[2]

#: torch's threads in a run process: a number, or "auto" (``auto_threads``)
Threads = int | Literal["auto"]


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: a SLURM job's own, a taskset's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def idle_cores(sample_seconds: float = 0.5) -> int:
    """The usable cores that no other process keeps busy now: each usable core's idle share over
    ``sample_seconds``, summed and rounded. Only where a count moves no number (how many runs at
    once, each on its own thread), never for a run's threads."""
    import psutil

    busy = psutil.cpu_percent(interval=sample_seconds, percpu=True)
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(len(busy))
    return int(sum(1 - busy[core] / 100 for core in cores if core < len(busy)) + 0.5)


def auto_threads(device: str) -> int:
    """Threads for a run when none are asked for. On the CPU, one: torch splits float sums by
    thread, so the count is part of a CPU run's numbers, and one thread gives the same numbers on
    every machine; torch's own default (every core) also makes a step 3 to 30 times slower when
    another process keeps a core busy (docs/running.md). On CUDA, where the GPU computes, every
    core the process may use."""
    return 1 if device == "cpu" else usable_cores()


def check_count_or_auto(value: object, what: str) -> int | Literal["auto"]:
    """``value`` as a whole number >= 1 or "auto", or one line naming ``what`` (a suite key or option)."""
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value  # type: ignore[return-value]
    if isinstance(value, str) and value.isdigit() and int(value) >= 1:
        return int(value)
    raise UserError(f'{what} must be a whole number >= 1 or "auto", not {value!r}')


def check_threads(value: object) -> Threads:
    """``value`` (a suite's ``threads`` or ``--threads``) as a ``Threads``, or one line."""
    return check_count_or_auto(value, "threads")


def set_threads(threads: Threads, device: str) -> int:
    """Set torch's intra-op threads for this process's runs on ``device`` (``auto_threads`` for
    "auto"); returns the count."""
    count = auto_threads(device) if threads == "auto" else threads
    torch.set_num_threads(count)
    return count


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def environment(device: str, threads_setting: Threads) -> dict:
    """Package versions, device, threads (``threads_setting``: what the run was asked for), git
    commit and host of this process."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    if device == "cuda":
        device_name = torch.cuda.get_device_name()
    else:
        device_name = platform.processor() or platform.machine()
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "python": sys.version.split()[0],
        "packages": versions,
        "device": device,
        "device_name": device_name,
        "torch_threads": torch.get_num_threads(),
        "threads_setting": threads_setting,  # --threads / the suite's threads: "auto" or a number
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
        "hostname": socket.gethostname(),
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def seed_everything(seed: int, task: int) -> None:
    """Seed every RNG from (run seed, task index); task -1 is the set-up before the first task.

    Seeding at the start of each task makes a resumed run identical to an uninterrupted one.
    """
    value = seed * 1_000_003 + task + 1
    random.seed(value)
    np.random.seed(value % 2**32)
    torch.manual_seed(value)


def set_deterministic(enabled: bool) -> None:
    """Make (or stop making) every kernel deterministic, the CUDA ones included.

    CPU kernels are deterministic anyway. On CUDA, atomics (attention backward, ``index_put_``
    with accumulate, scatter-adds) make reruns differ in the last bits; with ``enabled`` torch
    picks deterministic kernels and cuBLAS a fixed workspace (``CUBLAS_WORKSPACE_CONFIG``, read
    when cuBLAS starts, so call this before any CUDA work).
    """
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(enabled)
    torch.backends.cudnn.benchmark = False


_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


def _reset_cpu_high_water_mark() -> bool:
    """Reset the kernel's resident-set high-water mark (``VmHWM``) to the current RSS (Linux)."""
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:  # not Linux, or /proc not writable here
        return False


def _cpu_high_water_mark() -> int | None:
    """``VmHWM`` of this process in bytes (Linux), or None."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # reported in kB
    except (OSError, ValueError, IndexError):
        pass
    return None


_cpu_reset_done = False


def reset_peak_memory(device: str) -> None:
    """Start a run's peak-memory measurement: the CUDA allocator's peak, or on Linux the
    process's resident high-water mark (``/proc/self/clear_refs`` with 5), so that a run measures
    its own peak and not that of an earlier run in the same process."""
    global _cpu_reset_done
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    else:
        _cpu_reset_done = _reset_cpu_high_water_mark()


def peak_memory(device: str) -> tuple[int, str]:
    """Peak memory in bytes since the last ``reset_peak_memory``, and what it measures:

    - ``cuda_allocated``: the CUDA allocator's peak;
    - ``cpu_run_peak_rss``: this process's resident high-water mark, reset when the run started
      (Linux; the data-loading worker processes are not included);
    - ``cpu_process_peak_rss``: where no reset is possible, the process's max RSS since it started,
      which also covers whatever ran before in the same process.
    """
    if device == "cuda":
        return int(torch.cuda.max_memory_allocated()), "cuda_allocated"
    if _cpu_reset_done and (high_water := _cpu_high_water_mark()) is not None:
        return high_water, "cpu_run_peak_rss"
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "cpu_process_peak_rss"
