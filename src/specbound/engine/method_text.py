"""A method and its options written as one text, as the command line, the server and the
auditor take it and ``Speculator.generate`` accepts it: ``NAME`` or ``NAME:KEY=VALUE:...``
('auto', 'chain:gamma=4', 'sparse:budget=12:depth=6:verifier=greedy').

Importing this module loads nothing heavy: the methods' registry (numba, scipy) is read
when a text is parsed.
"""

from __future__ import annotations


def parse_method(text: str, defaults: dict | None = None, option: str = "method") -> tuple[str, dict]:
    """``text`` -> (name, options); values are ints where they parse as ints, floats where
    they parse as floats. ``defaults`` fill the options the text leaves out (those the
    method takes and that are not None); messages name ``option``. Every value is checked,
    and the method built, before any model loads."""
    from specbound.engine.methods import METHODS, build_method, method_options

    name, *pairs = [part.strip() for part in text.split(":")]
    if name != "auto" and name not in METHODS:
        raise ValueError(f"{option}: unknown method {name!r}; choose auto or one of {sorted(METHODS)}")
    taken = [] if name == "auto" else method_options(name)
    options = {key: value for key, value in (defaults or {}).items() if key in taken and value is not None}
    given = set()
    for pair in pairs:
        key, separator, value = pair.partition("=")
        if not separator or not key:
            raise ValueError(f"{option}: expected KEY=VALUE after {name!r}, got {pair!r}")
        if key not in taken:
            raise ValueError(f"{option}: {name!r} takes no option {key!r}")
        if key in given:
            raise ValueError(f"{option}: {text!r} gives {key!r} twice; give each option once")
        given.add(key)
        options[key] = _option_value(value)
    if name != "auto":
        build_method(name, **options)
    return name, options


def _option_value(text: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
