"""User-facing errors.

Anything a user can fix (a bad flag, a missing data root or weight file, a corrupt result file)
raises ``UserError``. The runner prints its message as one line and exits with code 2, with no
traceback. The message states the cause and the fix.
"""

from __future__ import annotations

import functools
import sys
from typing import Callable


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


def one_line_warning(message, category, filename, lineno, line=None) -> str:
    """``warnings.formatwarning`` for the commands: a notice for the user, not a source location."""
    return f"warning: {message}\n"
