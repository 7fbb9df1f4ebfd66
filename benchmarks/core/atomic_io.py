"""Files that a reader sees whole or not at all: every result, sidecar, checkpoint and table is
written to a temporary file in the same folder, flushed to disk, then renamed over the target.

A process killed between the two (kill -9, a lost node) leaves its temporary file behind, hidden
(``.T10-seed0.json.<host>-<pid>.<random>.tmp``); the next write of the same file removes it
(``remove_stale_temps``), so a rerun leaves no debris. The writer's host and pid in the name tell
a dead writer's file from one still being written by another process."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.core.errors import UserError

if TYPE_CHECKING:  # torch is imported where tensors are written, not with this module
    import torch


def _readable_like_any_new_file(fd: int) -> None:
    """``mkstemp`` makes files only their owner may read; give the file the mode that ``open``
    would (0666 less the umask), so that a group sharing a results folder can read it."""
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)


#: a temporary file of a writer on another host (or from before names held the writer) counts as
#: debris once untouched this long: no write of one file takes minutes, so it is no write under way
STALE_TEMP_SECONDS = 600.0


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())[:64] or "host"


def _temp_prefix(path: Path) -> str:
    """``.<name>.<host>-<pid>.``: whose temporary file it is, for ``remove_stale_temps``."""
    return f".{path.name}.{_host()}-{os.getpid()}."


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):  # another user's process, or no pid at all
        return pid > 0
    return True


def owned_temp_dir(prefix: str) -> Path:
    """A new folder in the system's temporary folder, ``<prefix><host>-<pid>-<random>``, for this
    process to remove when done. The ones that processes on this host left when they died (a run
    killed with SIGKILL removes nothing) are removed first; another host's are left alone."""
    root = Path(tempfile.gettempdir())
    own = re.compile(rf"{re.escape(prefix)}{re.escape(_host())}-(?P<pid>\d+)-[^/]+")
    for folder in root.glob(f"{glob.escape(prefix)}*"):
        match = own.fullmatch(folder.name)
        if match is not None and not _pid_alive(int(match["pid"])):
            shutil.rmtree(folder, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{_host()}-{os.getpid()}-"))


def remove_stale_temps(path: Path) -> list[Path]:
    """Remove the temporary files that interrupted writes of ``path`` left (a kill between the
    temporary file and the rename): those of a dead process on this host, and any other one
    untouched for ``STALE_TEMP_SECONDS``. A write under way in another live process keeps its file.
    Returns the files removed."""
    path = Path(path)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.(?:(?P<host>.+)-(?P<pid>\d+)\.)?[^.]+\.tmp")
    removed: list[Path] = []
    try:
        candidates = [p for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.")]
    except OSError:  # no folder yet: nothing to clean
        return removed
    for candidate in candidates:
        match = pattern.fullmatch(candidate.name)
        if match is None:
            continue
        try:
            age = time.time() - candidate.stat().st_mtime
        except FileNotFoundError:  # renamed or removed meanwhile
            continue
        mine = match["host"] == _host() and match["pid"] is not None
        dead = mine and int(match["pid"]) != os.getpid() and not _pid_alive(int(match["pid"]))
        if dead or age > STALE_TEMP_SECONDS:
            candidate.unlink(missing_ok=True)
            removed.append(candidate)
    return removed


def atomic_write_bytes(path: Path, blob: bytes) -> None:
    """Write ``blob`` to ``path`` so that readers see the old file or the new one, never half;
    temporary files that earlier, interrupted writes of ``path`` left are removed first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_temp_prefix(path), suffix=".tmp")
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


#: the safetensors metadata entry naming the tensors saved once under another name (``write_tensors``)
SHARED_TENSORS = "shared_tensors"


def write_tensors(path: Path, tensors: dict) -> None:
    """Save torch ``tensors`` as one safetensors file, atomically (``atomic_write_bytes``).

    Safetensors refuses tensors that share memory, which a learner's aliases make (PyCIL's
    ``_network_module_ptr``): each view held under several names is saved once, and the file's
    metadata names the others (``read_tensors`` gives them back as the same tensor)."""
    from safetensors.torch import save

    unique, shared = saved_once(tensors)
    atomic_write_bytes(path, save(unique, metadata={SHARED_TENSORS: json.dumps(shared)} if shared else None))


def saved_once(tensors: dict) -> tuple[dict, dict[str, str]]:
    """``tensors`` with every entry that repeats an earlier one's view (the same memory, shape,
    strides and dtype) left out, and ``{left-out name: kept name}``. A tensor that overlaps an earlier
    one's memory in another view is copied, so that no two entries share memory."""
    unique: dict[str, torch.Tensor] = {}
    shared: dict[str, str] = {}
    views: dict[tuple, str] = {}
    storages: set[int] = set()
    for name, tensor in tensors.items():
        if tensor.numel() == 0:  # no memory to share
            unique[name] = tensor
            continue
        storage = tensor.untyped_storage().data_ptr()
        view = (storage, tensor.storage_offset(), tuple(tensor.shape), tensor.stride(), tensor.dtype)
        if view in views:
            shared[name] = views[view]
            continue
        views[view] = name
        unique[name] = tensor.clone() if storage in storages else tensor
        storages.add(storage)
    return unique, shared


def read_tensors(path: Path) -> dict:
    """The tensors ``write_tensors`` saved at ``path``, each saved-once name back as the same tensor."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    with safe_open(str(path), "pt") as file:
        shared = json.loads((file.metadata() or {}).get(SHARED_TENSORS, "{}"))
    for name, kept in shared.items():
        tensors[name] = tensors[kept]
    return tensors


def write_json(path: Path, data: Any) -> None:
    atomic_write_text(Path(path), json.dumps(data, indent=1, allow_nan=False) + "\n")


def read_json_object(path: Path, **fields: type | tuple[type, ...]) -> dict | None:
    """A record the suite writes beside its results (a checkpoint's state, a lock's error or queued
    mark): the JSON object, or None where the file is missing or damaged: unreadable, not UTF-8,
    not JSON, not an object, or without one of ``fields`` of its type (``tasks_done=int``). The one
    reader of these records, so every damage reads as "no record", never as a traceback."""
    try:
        data = json.loads(Path(path).read_bytes().decode("utf-8"))
    except (OSError, ValueError):  # missing, a folder, no right to read; not UTF-8 or not JSON
        return None
    if not isinstance(data, dict):
        return None
    for name, kind in fields.items():
        kinds, value = kind if isinstance(kind, tuple) else (kind,), data.get(name)
        a_bool_for_a_number = isinstance(value, bool) and bool not in kinds  # true is no count
        if not isinstance(value, kinds) or a_bool_for_a_number:
            return None
    return data


def read_json(path: Path) -> Any:
    """Read a JSON file; a corrupt one is a user error that names the file and the fix."""
    try:
        return json.loads(Path(path).read_bytes().decode("utf-8"))
    except json.JSONDecodeError as err:
        raise UserError(
            f"corrupt result file {path} ({err.msg} at line {err.lineno}); "
            "delete it and rerun, or rerun with --force"
        ) from None
    except UnicodeDecodeError as err:  # JSON is UTF-8: these bytes are no JSON file of ours
        raise UserError(
            f"corrupt result file {path} (not UTF-8 text: byte {err.start}: {err.reason}); "
            "delete it and rerun, or rerun with --force"
        ) from None
