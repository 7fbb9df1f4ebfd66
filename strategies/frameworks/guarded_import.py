"""Importing another framework's code without letting the import change the run.

``importing(target, name)`` wraps the import of ``module.path:Class``: the working directory and
``sys.path`` are put back afterwards (Mammoth's ``models/__init__.py`` changes both), and the
network is closed to the importing thread, so a module that downloads at import (Mammoth's
``datasets/seq_8vision.py`` fetches CLIP weights in a class body) is refused at once, not after a
45 s timeout. A module other than the one asked for that tries is left out of the import: it stays
half-run in ``sys.modules``, a note on stderr names it (harmless unless the run uses it), and any
later use of a name it would have defined is one line. When the module asked for (or a package
above it) tries, the import stops in one line that names it.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import socket
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from benchmarks.core.errors import UserError


class DownloadRefused(BaseException):
    """A network call during a guarded import. A BaseException, so that the libraries on the way
    (``except Exception`` and retry loops) let it through to the module being imported."""

    def __init__(self, module: str, where: str) -> None:
        super().__init__(f"module {module} tried to reach {where} while it was imported")
        self.module, self.where = module, where


class LeftOut(UserError, AttributeError):
    """A name of a module left out of an import (an AttributeError, so ``hasattr`` says False)."""


def _importing_module() -> str:
    """The module whose top-level code is running: the innermost ``<module>`` frame."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>":
            return str(frame.f_globals.get("__name__", "?"))
        frame = frame.f_back
    return "?"


def _address(args: tuple, kwargs: dict) -> str:
    target = args[0] if args else kwargs.get("address", kwargs.get("host", "?"))
    if isinstance(target, tuple) and len(target) >= 2:
        return f"{target[0]}:{target[1]}"
    return str(target)


class _Network:
    """``socket``'s ways out, closed to one thread while the block runs."""

    def __init__(self, thread: int) -> None:
        self.thread = thread
        self.saved: list[tuple[Any, str, Any, bool]] = []

    def _refusing(self, original, is_method: bool):
        thread = self.thread

        def refuse(*args, **kwargs):
            if threading.get_ident() != thread:
                return original(*args, **kwargs)
            if is_method:
                sock, args = args[0], args[1:]
                if sock.family not in (socket.AF_INET, socket.AF_INET6):  # a local (unix) socket
                    return original(sock, *args, **kwargs)
            raise DownloadRefused(_importing_module(), _address(args, kwargs))

        return refuse

    def __enter__(self) -> _Network:
        for owner, attr, is_method in (
            (socket, "getaddrinfo", False),
            (socket, "create_connection", False),
            (socket.socket, "connect", True),
            (socket.socket, "connect_ex", True),
        ):
            own = attr in vars(owner)
            original = getattr(owner, attr)
            self.saved.append((owner, attr, original, own))
            setattr(owner, attr, self._refusing(original, is_method))
        return self

    def __exit__(self, *exc) -> None:
        for owner, attr, original, own in reversed(self.saved):
            if own:
                setattr(owner, attr, original)
            else:
                delattr(owner, attr)


class _Containing(importlib.abc.MetaPathFinder):
    """Finds modules as ``PathFinder`` does, with a loader that keeps a refused download inside the
    module that tried it (unless that module is one of ``kept``: the target and its packages)."""

    def __init__(self, kept: set[str], left_out: dict[str, str]) -> None:
        self.kept, self.left_out = kept, left_out

    def find_spec(self, fullname, path=None, target=None):
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None or fullname in self.kept:
            return spec
        spec.loader = _ContainingLoader(spec.loader, self.left_out)
        return spec


class _ContainingLoader(importlib.abc.Loader):
    def __init__(self, loader, left_out: dict[str, str]) -> None:
        self.loader, self.left_out = loader, left_out

    def __getattr__(self, name: str):  # get_filename, get_resource_reader, ... as the real loader's
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        try:
            self.loader.exec_module(module)
        except DownloadRefused as refused:
            if refused.module != module.__name__:
                raise
            self.left_out[module.__name__] = refused.where
            module.__getattr__ = _refuser(module.__name__, refused.where)


def _refuser(module: str, where: str):
    def refuse(attr: str):
        raise LeftOut(
            f"{module}.{attr} does not exist: module {module} tried to download from {where} while "
            "it was imported, which the suite refuses (it runs offline), so it was left out"
        )

    return refuse


@contextlib.contextmanager
def importing(target: str, name: str) -> Iterator[None]:
    """The block imports ``target`` (``module.path:Class``) for strategy ``name``; see the module's
    docstring for what it keeps."""
    module = target.partition(":")[0]
    parts = module.split(".")
    kept = {".".join(parts[: i + 1]) for i in range(len(parts))}
    cwd, path = os.getcwd(), list(sys.path)
    left_out: dict[str, str] = {}
    finder = _Containing(kept, left_out)
    sys.meta_path.insert(0, finder)
    try:
        with _Network(threading.get_ident()):
            yield
    except DownloadRefused as refused:
        raise UserError(
            f"cannot import {name}: module {refused.module} tried to download from {refused.where} "
            "while it was imported, which the suite refuses (it runs offline); put what it fetches "
            "where the module looks for it, or import it from a module that does not download"
        ) from None
    finally:
        sys.meta_path.remove(finder)
        os.chdir(cwd)
        sys.path[:] = path
    for skipped, where in left_out.items():
        print(  # a note, not an error: Mammoth's own seq_8vision does it on every import
            f"note: importing {name} skipped module {skipped}, which downloads from {where} when it is "
            "imported (the suite runs offline); the run is unaffected unless it uses that module",
            file=sys.stderr,
        )
