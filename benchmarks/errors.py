"""User-facing errors.

Anything a user can fix (a bad flag, a missing data root or weight file, a corrupt result file)
raises ``UserError``. The runner prints its message as one line and exits with code 2, with no
traceback. The message states the cause and the fix.
"""


class UserError(Exception):
    """A problem in the user's input or environment, reported without a traceback."""


class DataNotFoundError(UserError):
    """A dataset folder or file is missing under the data root."""


class WeightsNotFoundError(UserError):
    """Pretrained CLIP weights are neither in the cache nor at the given path."""
