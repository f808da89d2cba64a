"""argparse types shared by the command line and the studies' own options: each turns one
option's text into a value or raises ``argparse.ArgumentTypeError`` with a one-line reason
(argparse then names the option and exits with status 2)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from specbound.checks import LARGEST_SEED


def integer(minimum: int | None = None, maximum: int | None = None):
    """An integer in [minimum, maximum] (an end left open when None); '1e3', '2.0' and
    bools' words are refused."""
    if minimum is not None and maximum is not None:
        phrase = f"an integer in [{minimum}, {maximum}]"
    elif minimum == 1:
        phrase = "a positive integer"
    elif minimum == 0:
        phrase = "a non-negative integer"
    elif minimum is not None:
        phrase = f"an integer ≥ {minimum}"
    else:
        phrase = "an integer"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {phrase}, got {_shown(text)}") from None
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"expected {phrase}, got {_shown(text)}")
        return value

    return parse


positive_int = integer(1)
non_negative_int = integer(0)
seed = integer(0, LARGEST_SEED)


def number(low: float = -math.inf, high: float = math.inf, low_open: bool = False):
    """A finite number in [low, high] ((low, high] with ``low_open``); NaN and ±inf refused."""
    if high == math.inf:
        interval = f"{'>' if low_open else '≥'} {low:g}"
    else:
        interval = f"in {'(' if low_open else '['}{low:g}, {high:g}]"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {_shown(text)}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {_shown(text)}")
        if value < low or value > high or (low_open and value == low):
            raise argparse.ArgumentTypeError(f"expected a number {interval}, got {_shown(text)}")
        return value

    return parse


positive_number = number(0.0, low_open=True)


def folder(text: str) -> str:
    """A folder to write into: created later when missing; a path that names an existing
    file (or nothing at all) is refused now, before any work."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a folder, got ''")
    path = Path(text)
    blocking = next((parent for parent in (path, *path.parents) if parent.exists()), None)
    if blocking is not None and not blocking.is_dir():
        raise argparse.ArgumentTypeError(f"{str(blocking)!r} is a file, not a folder")
    return text


class _DefaultText(str):
    pass


class _DefaultList(list):
    pass


class _DefaultInt(int):
    pass


class _DefaultFloat(float):
    pass


_MARKED = {str: _DefaultText, list: _DefaultList, int: _DefaultInt, float: _DefaultFloat}


def default(value: str | list | int | float):
    """``value`` marked as an option's default: argparse hands a default over as it is (a
    string one unparsed when the option has no ``type``), so ``given`` tells it apart from
    the same value given on the command line — to refuse an option only where it was given
    and another option's choice leaves it unused."""
    return _MARKED[type(value)](value)


def given(value) -> bool:
    """Whether an option's value came from the command line: neither a ``default`` nor None."""
    return value is not None and not isinstance(value, tuple(_MARKED.values()))


def _shown(text: str) -> str:
    """``text`` for a message: repr, cut to 40 characters (a message stays one short line)."""
    return repr(text) if len(text) <= 40 else repr(text[:40]) + f"… ({len(text)} characters)"


def comma_list(kind):
    """'a,b,c' -> [kind(a), kind(b), kind(c)]; blanks are skipped, an empty list refused;
    a bad item is named with ``kind``'s own reason."""
    def parse(text: str) -> list:
        values = []
        for item in (value for value in text.split(",") if value.strip()):
            try:
                values.append(kind(item))
            except argparse.ArgumentTypeError as error:
                raise argparse.ArgumentTypeError(f"{error} (in {_shown(text)})") from None
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {_shown(text)}") from None
        if not values:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {_shown(text)}")
        return values

    return parse


def names(choices):
    """A comma-separated selection from ``choices``."""
    def parse(text: str) -> list[str]:
        chosen = [name.strip() for name in text.split(",") if name.strip()]
        unknown = [name for name in chosen if name not in choices]
        if unknown or not chosen:
            raise argparse.ArgumentTypeError(f"unknown {_shown(', '.join(unknown)) if unknown else _shown(text)}; "
                                             f"choose from {', '.join(choices)}")
        return chosen

    return parse


def lookahead(text: str) -> int | None:
    """'inf' (K = ∞, to the horizon) or a positive integer γ."""
    if text.strip().lower() in ("inf", "∞"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'inf' or a positive integer, got {_shown(text)}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 'inf' or a positive integer, got {_shown(text)}")
    return value


def pairs(kind=float):
    """'a:b;c:d' -> [(a, b), (c, d)]."""
    def parse(text: str) -> list[tuple]:
        try:
            parsed = [tuple(kind(value) for value in pair.split(":")) for pair in text.split(";")]
        except argparse.ArgumentTypeError as error:
            raise argparse.ArgumentTypeError(f"in 'a:b;c:d' pairs {_shown(text)}: {error}") from None
        except ValueError:
            parsed = []
        if not parsed or any(len(pair) != 2 for pair in parsed):
            raise argparse.ArgumentTypeError(f"expected 'a:b;c:d' pairs, got {_shown(text)}")
        return parsed

    return parse


def numbers(text: str) -> list[float]:
    """Comma-separated finite numbers."""
    try:
        values = [float(value) for value in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {_shown(text)}") from None
    if not all(math.isfinite(value) for value in values):
        raise argparse.ArgumentTypeError(f"expected finite numbers, got {_shown(text)}")
    return values
