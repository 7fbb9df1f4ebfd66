"""Running another framework's code unchanged.

Its files are never edited. What the suite must change while the code runs (an epoch count kept as
a module constant, a progress bar under ``--quiet``, a network factory that should build on the
run's CLIP) is set on the imported module for the duration of one call and put back afterwards, so
the module is as its authors wrote it for anyone else in the process. An exception raised inside
its files becomes one line that names the file, the line and what the suite passed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
import sys
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks.core.errors import UserError

# Epoch counts and the epochs of a multi-step schedule, as the LAMDA family names them
# (init_epoch, epochs, boosting_epochs, tuned_epoch, CLG-CBM's FB_epoch_inc; init_milestones,
# milestones): "epoch" or "epochs" as a word of the name.
_EPOCH_NAME = re.compile(r"(?:^|_)epochs?(?:_|$)")
_MILESTONE_NAME = re.compile(r"(?:^|_)milestones$")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def scaled_epoch_value(name: str, value: Any, scale: float, cap: int | None) -> Any | None:
    """``value`` of an epoch option ``name`` under the suite's ``epoch_scale`` (rounded, at least 1)
    and a fast dev run's cap; milestones scale with the epochs so the schedule keeps its shape.
    None when ``name`` is not an epoch option."""
    if _EPOCH_NAME.search(name) and _is_count(value) and value > 0:
        scaled = max(1, round(value * scale))
        return min(scaled, cap) if cap is not None else scaled
    if (
        _MILESTONE_NAME.search(name)
        and isinstance(value, (list, tuple))
        and value
        and all(_is_count(m) for m in value)
    ):
        return type(value)(max(1, round(m * scale)) for m in value)
    return None


def scaled_epochs(values: dict[str, Any], scale: float, cap: int | None) -> dict[str, tuple[Any, Any]]:
    """The epoch options among ``values`` that change: name -> (as given, as run)."""
    changes = {}
    for name, value in values.items():
        new = scaled_epoch_value(name, value, scale, cap)
        if new is not None and new != value:
            changes[name] = (value, new)
    return changes


@contextlib.contextmanager
def patched(module: ModuleType, values: dict[str, Any]) -> Iterator[None]:
    """``module``'s attributes ``values`` set for the block, and put back however it ends."""
    missing = object()
    before = {name: getattr(module, name, missing) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is missing:
                delattr(module, name)
            else:
                setattr(module, name, value)


def root_of(module_name: str) -> Path:
    """The folder that holds ``module_name``'s top-level package (a checkout's root)."""
    top = sys.modules[module_name.partition(".")[0]]
    paths = list(getattr(top, "__path__", [])) or [str(Path(str(top.__file__)).parent / "_")]
    return Path(paths[0]).resolve().parent


def modules_under(root: Path) -> list[ModuleType]:
    """The imported modules whose file lies under ``root``."""
    found = []
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if file and _real_path(file).is_relative_to(root):
            found.append(module)
    return found


@functools.lru_cache(maxsize=None)
def _real_path(file: str) -> Path:
    """``file`` with its links resolved, once per process: an adapter asks for the modules under its
    code's root at every build and task, and resolving the 6,000 files torch and Avalanche import
    took 0.2 s each time."""
    return Path(file).resolve()


def quiet_patches(modules: list[ModuleType]) -> list[tuple[ModuleType, dict[str, Any]]]:
    """For each module that drew its bars with tqdm: the same tqdm, disabled."""
    from tqdm import tqdm as plain
    from tqdm.auto import tqdm as auto

    patches = []
    for module in modules:
        bar = getattr(module, "tqdm", None)
        if bar is plain or bar is auto:
            patches.append((module, {"tqdm": functools.partial(bar, disable=True)}))
    return patches


@contextlib.contextmanager
def silenced_logging() -> Iterator[None]:
    """Every logging call at WARNING or below dropped for the block (``--quiet``)."""
    before = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(before)


@contextlib.contextmanager
def running_upstream(
    root: Path,
    name: str,
    doing: str,
    passed,
    patches: Sequence[tuple[ModuleType, dict[str, Any]]] = (),
    quiet_modules: list[ModuleType] | None = None,
) -> Iterator[None]:
    """The framework's code (its checkout at ``root``) runs in the block: ``patches`` set on its
    modules, its bars (in ``quiet_modules``, the caller's list: scanning ``sys.modules`` per batch
    would cost) and logging silenced when that is given, and an exception raised in its files one
    line (``upstream_error``, with ``passed()``: what the suite gave it)."""
    with contextlib.ExitStack() as stack:
        patches = list(patches)
        if quiet_modules is not None:
            patches += quiet_patches(quiet_modules)
            stack.enter_context(silenced_logging())
        for module, values in patches:
            stack.enter_context(patched(module, values))
        try:
            yield
        except Exception as err:
            line = upstream_error(err, root, name, doing, passed())
            if line is None:
                raise
            raise line from err


def upstream_error(err: BaseException, root: Path, name: str, doing: str, passed: str) -> UserError | None:
    """``err`` as one line when it was raised inside (or through) a file under ``root``: the
    innermost such file and line, the exception, and what the suite passed; None otherwise."""
    if isinstance(err, UserError):
        return None
    frames = [f for f in traceback.extract_tb(err.__traceback__) if _under(f.filename, root)]
    if not frames:
        return None
    where = frames[-1]
    at = f"{Path(where.filename).resolve().relative_to(root)}:{where.lineno} ({where.name})"
    message = str(err).splitlines()[0] if str(err) else ""
    parsed = _file_being_parsed(err)
    if parsed is not None:
        message += f" in {parsed}"
    empty = _empty_module_file(err, root)
    if empty is not None:
        message += f" (its file {empty} is empty: 0 bytes in the checkout)"
    if _needs_cuda(err):
        return UserError(
            f"{name}: its code calls CUDA at {at} while {doing}, and this run has no CUDA device "
            f"({type(err).__name__}: {message}); run it on a machine with a GPU (--device cuda)"
        )
    return UserError(
        f"{name}: {type(err).__name__}: {message} at {at} while {doing}; the suite passed {passed}"
    )


def _under(filename: str, root: Path) -> bool:
    try:
        return Path(filename).resolve().is_relative_to(root)
    except (OSError, ValueError):
        return False


def _file_being_parsed(err: BaseException) -> str | None:
    """The file ``json.load`` was reading when ``err`` (a JSONDecodeError) was raised, with its size:
    the decoder's message names a line and column but not the file (C3Box's ENGINE reads one a
    dataset, and an empty one reads as ``Expecting value: line 1 column 1``)."""
    if not isinstance(err, json.JSONDecodeError):
        return None
    for frame, _ in traceback.walk_tb(err.__traceback__):
        source = frame.f_locals.get("fp") if frame.f_code.co_name == "load" else None
        name = getattr(source, "name", None)
        if isinstance(name, str):
            try:
                return f"{name} ({Path(name).stat().st_size} bytes)"
            except OSError:
                return name
    return None


def _empty_module_file(err: BaseException, root: Path) -> str | None:
    """The file, relative to ``root``, of the module whose missing attribute raised ``err`` when
    that file is empty: its name is all a "has no attribute" line can point at (C3Box's
    ``backbone/loraclip/loralib/utils.py`` is the empty blob at 1378ab2)."""
    module = getattr(err, "obj", None) if isinstance(err, AttributeError) else None
    filename = getattr(module, "__file__", None) if isinstance(module, ModuleType) else None
    if not isinstance(filename, str):
        return None
    try:
        path = Path(filename).resolve()
        if path.stat().st_size != 0:
            return None
    except OSError:
        return None
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def _needs_cuda(err: BaseException) -> bool:
    text = str(err)
    return any(
        hint in text for hint in ("not compiled with CUDA", "no NVIDIA driver", "CUDA driver", "CUDA-capable")
    )
