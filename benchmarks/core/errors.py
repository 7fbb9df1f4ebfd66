"""User-facing errors.

Anything a user can fix (a bad flag, a missing data root or weight file, a corrupt result file)
raises ``UserError``. Every command prints its message as one line and exits with code 2, with no
traceback (``one_line_user_errors``); a bad argument is one such line too (``CommandParser``). The
message states the cause and the fix.
"""

from __future__ import annotations

import argparse
import errno
import functools
import sys
from pathlib import Path
from typing import Callable

#: ``OSError`` numbers that are the machine's problem, which the user fixes, not a bug: a full disk
#: or quota, a folder one may not write, or a path under (or over) a file
STORAGE_ERRORS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST}
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


def one_line_user_errors(main: Callable[..., int]) -> Callable[..., int]:
    """Wrap a command's ``main``: a ``UserError`` prints ``error: <message>`` on stderr and the
    command returns 2, with no traceback."""

    @functools.wraps(main)
    def command(*args, **kwargs) -> int:
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

    def error(self, message: str):
        self.exit(2, f"error: {message}; see {self.prog} --help\n")


def output_folder(path: str | Path, flag: str) -> Path:
    """``path`` as the folder a command writes into; refused in one line when it is a file (the
    command would otherwise fail half-way, after its work)."""
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{flag} {folder} is a file, not a folder; give a folder (new or existing)")
    return folder


def storage_error(err: OSError, what: str, fix: str) -> UserError | None:
    """The one-line ``UserError`` for an ``OSError`` that is a storage problem (``STORAGE_ERRORS``):
    ``cannot <what> (<file>): <cause>; <fix>``. ``None`` for any other ``OSError``: a bug, to be
    raised as it is."""
    if err.errno not in STORAGE_ERRORS:
        return None
    where = f" ({err.filename})" if err.filename else ""
    return UserError(f"cannot {what}{where}: {err.strerror}; {fix}")


def one_line_warning(message, category, filename, lineno, line=None) -> str:
    """``warnings.formatwarning`` for the commands: a notice for the user, not a source location."""
    return f"warning: {message}\n"
