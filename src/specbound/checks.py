"""Argument checks shared by every layer: a bad value raises ValueError naming the argument.

One copy of each rule, so that a message reads the same wherever the value came from
(a Python call, a command-line option, a settings file).
"""

from __future__ import annotations

import math
import numbers
import os

WORK_SECONDS_VARIABLE = "SPECBOUND_WORK_LIMIT_SECONDS"  # raises every limit on estimated seconds of work
WORK_BYTES_VARIABLE = "SPECBOUND_WORK_LIMIT_BYTES"  # ... and on estimated bytes
LARGEST_SEED = 2**63 - 1  # numpy takes any non-negative int; torch.manual_seed 64 bits


def positive_int(name: str, value, minimum: int = 1) -> int:
    """``value`` as an int ≥ ``minimum`` (1 by default); bools and non-integers are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name}: expected {_integer_phrase(minimum)}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: expected {_integer_phrase(minimum)}, got {value}")
    return int(value)


def seed_value(name: str, value) -> int:
    """``value`` as a seed: an int in [0, ``LARGEST_SEED``] (a TypeError for a non-integer, a
    ValueError outside the range, each naming ``name``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an integer in [0, {LARGEST_SEED}], got {type(value).__name__} {value!r}")
    if not 0 <= value <= LARGEST_SEED:
        raise ValueError(f"{name}: expected an integer in [0, {LARGEST_SEED}], got {value}")
    return int(value)


def _integer_phrase(minimum: int) -> str:
    if minimum == 1:
        return "a positive integer"
    if minimum == 0:
        return "a non-negative integer"
    return f"an integer ≥ {minimum}"


def finite_number(name: str, value, low: float = -math.inf, high: float = math.inf) -> float:
    """``value`` as a float in [low, high]; bools, NaN and infinities are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name}: expected {_range_phrase(low, high)}, got {value!r}")
    return float(value)


def _range_phrase(low: float, high: float) -> str:
    """The finite numbers in [low, high] in words, an infinite end left unsaid."""
    if high == math.inf:
        return f"a finite number ≥ {low:g}"
    if low == -math.inf:
        return f"a finite number ≤ {high:g}"
    return f"a number in [{low:g}, {high:g}]"


def unicode_text(name: str, value) -> str:
    """``value`` as a str that UTF-8 can encode: no lone surrogate, which is what Python
    makes of bytes that are not UTF-8 (in a command-line argument, say)."""
    if not isinstance(value, str):
        raise ValueError(f"{name}: expected a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"{name}: not valid Unicode text (character {error.start:,} is {value[error.start]!r}, "
                         "from bytes that are not UTF-8)") from None
    return value


class WorkLimitError(ValueError):
    """A request whose estimated work (time or memory) is beyond a stated limit: refused
    before it starts, with the estimate and the limit in the message, so a command exits
    with status 2 instead of running without bound. A ValueError, so every caller that
    reports bad input reports this too."""


def within_limit(name: str, estimate: float, limit: float, unit: str, hint: str = "") -> None:
    """Raise WorkLimitError naming ``name`` when ``estimate`` exceeds ``limit``."""
    if not estimate <= limit:
        raise WorkLimitError(
            f"{name}: this needs about {_amount(estimate)} {unit}, above the limit of {_amount(limit)} {unit}"
            + (f"; {hint}" if hint else "")
        )


def within_work_limit(name: str, estimate: float, default_limit: float, variable: str, unit: str,
                      hint: str = "") -> None:
    """``within_limit`` against ``work_limit(variable, default_limit)``; the message says how
    to raise the limit."""
    raise_it = f"or raise the limit with {variable}"
    within_limit(name, estimate, work_limit(variable, default_limit), unit, f"{hint}, {raise_it}" if hint else raise_it)


def work_limit(variable: str, default_limit: float) -> float:
    """The positive number the environment variable ``variable`` holds, else ``default_limit``:
    how a user allows more work than the limits that refuse it by estimate."""
    text = os.environ.get(variable, "").strip()
    if not text:
        return default_limit
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{variable}: expected a positive number, got {text!r}")
    return value


def _amount(value: float) -> str:
    """3 significant digits; whole numbers below 10⁷ in full (4,096, not 4.1e+03)."""
    if float(value).is_integer() and abs(value) < 1e7:
        return f"{int(value):,}"
    return f"{value:,.3g}"
