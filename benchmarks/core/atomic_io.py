"""Files that a reader sees whole or not at all: every result, sidecar, checkpoint and table is
written to a temporary file in the same folder, flushed to disk, then renamed over the target."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.core.errors import UserError


def _readable_like_any_new_file(fd: int) -> None:
    """``mkstemp`` makes files only their owner may read; give the file the mode that ``open``
    would (0666 less the umask), so that a group sharing a results folder can read it."""
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)


def atomic_write_bytes(path: Path, blob: bytes) -> None:
    """Write ``blob`` to ``path`` so that readers see the old file or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        _readable_like_any_new_file(fd)
        with os.fdopen(fd, "wb") as handle:
            handle.write(blob)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """``atomic_write_bytes`` of ``text`` in UTF-8."""
    atomic_write_bytes(path, text.encode())


def write_tensors(path: Path, tensors: dict) -> None:
    """Save torch ``tensors`` as one safetensors file, atomically (``atomic_write_bytes``)."""
    from safetensors.torch import save

    atomic_write_bytes(path, save(tensors))


def write_json(path: Path, data: Any) -> None:
    atomic_write_text(Path(path), json.dumps(data, indent=1, allow_nan=False) + "\n")


def read_json(path: Path) -> Any:
    """Read a JSON file; a corrupt one is a user error that names the file and the fix."""
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise UserError(
            f"corrupt result file {path} ({err.msg} at line {err.lineno}); "
            "delete it and rerun, or rerun with --force"
        ) from None
