"""Where specbound keeps what it computes once: the cache root, shared by every layer.

``$SPECBOUND_CACHE``, else ``$XDG_CACHE_HOME/specbound``, else ``~/.cache/specbound``. Below
it: ``gguf/`` (the embedded models, ``models.gguf``), ``numba/`` (compiled loops,
``compiled``), ``costs.json`` (measured forward costs, ``engine.cost_book``), the quantised copies
(``engine.backends.quantize``) and the llama.cpp AMX probe's verdicts.
"""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """The cache root: ``$SPECBOUND_CACHE``, else ``$XDG_CACHE_HOME/specbound``, else ``~/.cache/specbound``."""
    if os.environ.get("SPECBOUND_CACHE"):
        return Path(os.environ["SPECBOUND_CACHE"]).expanduser()
    xdg_cache = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg_cache) if xdg_cache else Path.home() / ".cache") / "specbound"
