"""Packages whose public names load on first use: importing the package stays light (no
torch until a name that needs it is asked for)."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_attributes(package: str, homes: dict[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package`` that imports each name of ``homes`` (name ->
    the module that defines it) when it is first asked for."""

    def __getattr__(name: str):
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(homes[name]), name)

    return __getattr__
