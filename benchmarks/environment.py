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

import numpy as np
import torch

PACKAGES = ("torch", "torchvision", "open_clip_torch", "peft", "avalanche-lib", "numpy",
            "scikit-learn", "safetensors", "pandas")
REPO_ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def environment(device: str) -> dict:
    """Package versions, device, git commit and host of this process."""
    versions = {}
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


def reset_peak_memory(device: str) -> None:
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def peak_memory(device: str) -> tuple[int, str]:
    """Peak memory in bytes and what it measures: the CUDA allocator's peak since the last
    ``reset_peak_memory``, or on a CPU the process's max RSS (a process peak: it also covers
    whatever ran before in the same process)."""
    if device == "cuda":
        return int(torch.cuda.max_memory_allocated()), "cuda_allocated"
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "cpu_max_rss"
