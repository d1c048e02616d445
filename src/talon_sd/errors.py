"""User-facing errors.

Every mistake a user can make (bad argument, unknown model, missing weights) raises
:class:`TalonError`, a :class:`ValueError` whose message is one line that names the argument and
what was expected. The CLI prints that line and exits non-zero, without a traceback.
"""

from __future__ import annotations


class TalonError(ValueError):
    """A user error: one line naming the bad argument and what is expected."""


class TalonWarning(UserWarning):
    """A value the user set was adjusted (e.g. max_new_tokens lowered to fit the context); shown once."""


def bad_argument(name: str, value: object, expected: str) -> TalonError:
    """Build the standard error: ``<name>: got <value!r>, expected <expected>``."""
    return TalonError(f"{name}: got {value!r}, expected {expected}")
