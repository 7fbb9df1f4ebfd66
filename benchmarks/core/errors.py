"""User-facing errors.

Anything a user can fix (a bad flag, a missing data root or weight file, a corrupt result file)
raises ``UserError``. Every command prints its message as one line and exits with code 2, with no
traceback (``one_line_user_errors``); a bad argument is one such line too (``CommandParser``). The
message states the cause and the fix.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Callable, NoReturn, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

#: ``OSError`` numbers that are the machine's problem, which the user fixes, not a bug: a full disk
#: or quota, a folder one may not write, or a path under (or over) a file
#: errors of the storage, not of the code, by class: the whole class is one line naming the file
#: and the cause, never a traceback (errno names a platform lacks are left out)
STORAGE_ERROR_CLASSES = {
    "no space": ("ENOSPC", "EDQUOT", "EFBIG"),
    "no right to write": ("EACCES", "EPERM", "EROFS", "ETXTBSY"),
    # not ENOENT: a file of the suite's own that is missing is a bug to see whole
    "a path that is not what it must be": (
        "ENOTDIR", "EISDIR", "EEXIST", "ELOOP", "ENAMETOOLONG", "ENOTEMPTY", "EXDEV", "EMLINK", "EBUSY",
    ),
    "a failing device or network filesystem": ("EIO", "ENXIO", "ENODEV", "ESTALE", "ENOLCK", "EREMOTEIO"),
    "too many open files": ("EMFILE", "ENFILE"),
}  # fmt: skip
STORAGE_ERRORS = frozenset(
    getattr(errno, name) for names in STORAGE_ERROR_CLASSES.values() for name in names if hasattr(errno, name)
)


class UserError(Exception):
    """A problem in the user's input or environment, reported without a traceback.

    ``options``: the suite options the message is about, where it is about some (a strategy
    config's checks set it), so that the runner names the tables that set exactly those."""

    def __init__(self, *args, options: tuple[str, ...] = ()):
        super().__init__(*args)
        self.options = tuple(options)


class DataNotFoundError(UserError):
    """A dataset folder or file is missing under the data root."""


class WeightsNotFoundError(UserError):
    """Pretrained CLIP weights are neither in the cache nor at the given path."""


def one_line_user_errors(main: Callable[P, R]) -> Callable[P, R | int]:
    """Wrap a command's ``main``: a ``UserError`` prints ``error: <message>`` on stderr and the
    command returns 2, with no traceback. A character the terminal's encoding lacks (a label
    ``café`` on an ASCII stdout) is printed escaped, never a ``UnicodeEncodeError``."""

    @functools.wraps(main)
    def command(*args: P.args, **kwargs: P.kwargs) -> R | int:
        for stream in (sys.stdout, sys.stderr):
            if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
                stream.reconfigure(errors="backslashreplace")
        try:
            return main(*args, **kwargs)
        except UserError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2

    return command


class CommandParser(argparse.ArgumentParser):
    """The argument parser of every command: a bad or missing argument prints one line,
    ``error: <what>; see <prog> --help``, and exits with 2, with no usage block (``--help`` still
    prints the whole usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}; see {self.prog} --help\n")

    def output_file(self, path: str | Path | None, flag: str = "--out") -> Path | None:
        """``output_file``, checked with the options: its refusal is this parser's one line."""
        try:
            return output_file(path, flag)
        except UserError as err:
            self.error(str(err))


def results_folder(
    path: str | Path, flag: str = "--results-dir", fix: str = "give the --results-dir of a run"
) -> Path:
    """``path`` as a folder of results a command reads; refused in one line when it does not exist
    or is a file."""
    folder = Path(path).expanduser()
    if not folder.exists():
        raise UserError(f"{flag} {folder} does not exist; {fix}")
    if not folder.is_dir():
        raise UserError(f"{flag} {folder} is a file, not a folder; {fix}")
    return folder


def output_folder(path: str | Path, flag: str) -> Path:
    """``path`` as the folder a command writes into; refused in one line when it, or the folder it
    would be made in, is a file (the command would otherwise fail half-way, after its work)."""
    folder = Path(path).expanduser()
    existing = next(p for p in (folder, *folder.absolute().parents) if p.exists())
    if not existing.is_dir():  # the folder itself, or a folder it would be made in
        where = "" if existing == folder else f" under {existing}, which"
        raise UserError(f"{flag} {folder}{where} is a file, not a folder; give a folder (new or existing)")
    return folder


def output_file(path: str | Path | None, flag: str) -> Path | None:
    """``path`` as the file a command writes at its end; refused in one line, before the command's
    work, when it is a folder or would be made under a file (it would otherwise fail after the work
    and lose its output). None stays None (no file asked for)."""
    if path is None:
        return None
    if str(path) == "":
        raise UserError(f"{flag} is empty; give a file path")
    file = Path(path).expanduser()
    if file.is_dir():
        raise UserError(f"{flag} {file} is a folder; give a file path")
    existing = next(p for p in file.absolute().parents if p.exists())
    if not existing.is_dir():
        raise UserError(f"{flag} {file} lies under {existing}, which is a file; give a path in a folder")
    return file


def positive_number(text: str) -> float:
    """An ``argparse`` type: a finite number above 0 (seconds, a budget), else the parser's one line."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a number above 0")
    return value


@contextlib.contextmanager
def one_line_storage_errors(what: str, fix: str) -> Iterator[None]:
    """Inside the block, an ``OSError`` that is a storage problem (``STORAGE_ERRORS``) becomes the
    one-line ``UserError`` ``cannot <what> (<file>): <cause>; <fix>``. Any other ``OSError`` is a
    bug and passes as it is."""
    try:
        yield
    except OSError as err:
        if err.errno not in STORAGE_ERRORS:
            raise
        where = f" ({err.filename})" if err.filename else ""
        raise UserError(f"cannot {what}{where}: {err.strerror}; {fix}") from None


def one_line_warning(message, category, filename, lineno, line=None) -> str:
    """``warnings.formatwarning`` for the commands: a notice for the user, not a source location."""
    return f"warning: {message}\n"
