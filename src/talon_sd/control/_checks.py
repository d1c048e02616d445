"""Small shared helpers of :mod:`talon_sd.control`: argument checks that raise
:class:`~talon_sd.errors.TalonError` naming the field, and a median."""

from __future__ import annotations

import math

from ..errors import bad_argument


def median(values) -> float:
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return 0.0
    middle = n // 2
    return ordered[middle] if n % 2 else 0.5 * (ordered[middle - 1] + ordered[middle])


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_seconds(value) -> bool:
    return is_number(value) and math.isfinite(value) and value >= 0


def check_int(name: str, value, low: int, expected: str, high: int | None = None) -> None:
    if not is_int(value) or value < low or (high is not None and value > high):
        raise bad_argument(name, value, expected)


def check_number(name: str, value, expected: str, valid, infinite_ok: bool = False) -> None:
    if (not is_number(value) or math.isnan(value) or (math.isinf(value) and not infinite_ok)
            or not valid(value)):
        raise bad_argument(name, value, expected)
