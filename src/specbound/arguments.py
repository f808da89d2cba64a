"""argparse types shared by the command line and the studies' own options: each turns one
option's text into a value or raises ``argparse.ArgumentTypeError`` with a one-line reason
(argparse then names the option and exits with status 2)."""

from __future__ import annotations

import argparse
import math


def comma_list(kind):
    """'a,b,c' -> [kind(a), kind(b), kind(c)]; blanks are skipped, an empty list refused."""
    def parse(text: str) -> list:
        try:
            values = [kind(value) for value in text.split(",") if value.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
        return values

    return parse


def names(choices):
    """A comma-separated selection from ``choices``."""
    def parse(text: str) -> list[str]:
        chosen = [name.strip() for name in text.split(",") if name.strip()]
        unknown = [name for name in chosen if name not in choices]
        if unknown or not chosen:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown) or repr(text)}; choose from {', '.join(choices)}")
        return chosen

    return parse


def lookahead(text: str) -> int | None:
    """'inf' (K = ∞, to the horizon) or a positive integer γ."""
    if text.strip().lower() in ("inf", "∞"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'inf' or a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 'inf' or a positive integer, got {text!r}")
    return value


def pairs(kind=float):
    """'a:b;c:d' -> [(a, b), (c, d)]."""
    def parse(text: str) -> list[tuple]:
        try:
            parsed = [tuple(kind(value) for value in pair.split(":")) for pair in text.split(";")]
        except ValueError:
            parsed = []
        if not parsed or any(len(pair) != 2 for pair in parsed):
            raise argparse.ArgumentTypeError(f"expected 'a:b;c:d' pairs, got {text!r}")
        return parsed

    return parse


def numbers(text: str) -> list[float]:
    """Comma-separated finite numbers."""
    try:
        values = [float(value) for value in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not all(math.isfinite(value) for value in values):
        raise argparse.ArgumentTypeError(f"expected finite numbers, got {text!r}")
    return values
