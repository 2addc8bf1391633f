"""The argument checks the per-sample transforms share: numbers, counts and probabilities."""

from __future__ import annotations

import math

from ..errors import UsageError

__all__ = ["check_int", "check_probability", "is_number"]


def is_number(value: object) -> bool:
    """Whether ``value`` is a finite int or float (not a bool).

    Example:
        >>> is_number(0.5), is_number(True), is_number(float("nan"))
        (True, False, False)
    """
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_int(name: str, value: object, *, low: int) -> int:
    """``value`` if it is an int of at least ``low``, else a :class:`~gpuload.UsageError` naming ``name``.

    Example:
        >>> check_int("num_ops", 2, low=0)
        2
    """
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise UsageError(f"{name} must be an int of at least {low}, got {value!r}")
    return value


def check_probability(name: str, value: object) -> float:
    """``value`` as a float if it is a probability in [0, 1], else a :class:`~gpuload.UsageError`.

    Example:
        >>> check_probability("p", 1)
        1.0
    """
    if not is_number(value) or not 0 <= value <= 1:
        raise UsageError(f"{name} must be a probability in [0, 1], got {value!r}")
    return float(value)
