"""A model's context length read before it loads, so that a request that cannot fit is
refused in a moment rather than after the weights are read.

``known_context(source)``: the positions a model source takes (prompt and new tokens),
read from what describes it without loading it — a GGUF file's header
(``<architecture>.context_length``, the first few keys: the file is never read whole), an
embedded model's GGUF where it is already on disk, a Hugging Face folder's ``config.json``
(``max_position_embeddings``, of its text model) — or None where that cannot be read. The
backends report the same figure once the model is loaded (``Backend.max_positions``). ``check_fits_context`` refuses, with it, new tokens that cannot
fit after any prompt.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from specbound.models.gguf import EMBEDDED_GGUFS, locate_parts
from specbound.paths import default_cache_dir

GGUF_MAGIC = b"GGUF"
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}  # GGUF types
STRING, ARRAY = 8, 9


def known_context(source, cache_dir=None) -> int | None:
    """The context length of the model ``source`` (an embedded model's name, a ``.gguf``
    file or a Hugging Face folder), or None where it cannot be read without loading it."""
    try:
        path = _embedded_file(str(source), cache_dir) if str(source) in EMBEDDED_GGUFS else Path(source)
        if path is None:
            return None
        if path.is_dir():
            return _config_context(path / "config.json")
        return gguf_context(path) if path.is_file() else None
    except (OSError, ValueError, struct.error, UnicodeDecodeError, ImportError):
        return None


def check_fits_context(max_new_tokens: int, sources, hint: str = "") -> None:
    """Refuse (ValueError naming ``max_new_tokens``) new tokens that no prompt leaves room
    for in the context of the models ``sources`` as their files say it (``known_context``;
    nothing is refused where none can be read): a prompt takes at least one position.
    ``hint``: what to add to the message (the command line's flag)."""
    limits = [limit for limit in map(known_context, sources) if limit is not None]
    if limits and max_new_tokens >= min(limits):
        raise ValueError(f"max_new_tokens: {max_new_tokens:,} new tokens after a prompt (of one token or more) exceed "
                         f"the models' context of {min(limits):,} positions; ask for at most {min(limits) - 1:,} less "
                         f"the prompt's tokens{hint}")


def _embedded_file(name: str, cache_dir) -> Path | None:
    """The GGUF file of the embedded model ``name`` where it already is on disk: its wheel's
    data file, or the one assembled from its parts in the cache."""
    asset = EMBEDDED_GGUFS[name]
    if len(asset.distributions) == 1:
        return locate_parts(asset)[0]
    assembled = Path(cache_dir or default_cache_dir()) / "gguf" / asset.file_name
    return assembled if assembled.is_file() and assembled.stat().st_size == asset.size else None


def gguf_context(path: Path) -> int | None:
    """``<general.architecture>.context_length`` from the header of the GGUF file ``path``
    (None where the header does not hold it); ValueError where it is no GGUF file."""
    with open(path, "rb") as file:
        if file.read(4) != GGUF_MAGIC:
            raise ValueError(f"{path}: not a GGUF file")
        version, _, count = struct.unpack("<IQQ", file.read(20))
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not read here")
        architecture = None
        for _ in range(count):
            key = _string(file)
            kind = struct.unpack("<I", file.read(4))[0]
            if key == "general.architecture" and kind == STRING:
                architecture = _string(file)
            elif architecture is not None and key == f"{architecture}.context_length" and kind in SCALARS:
                return int(_scalar(file, kind))
            else:
                _skip(file, kind)
    return None


def _string(file) -> str:
    length = struct.unpack("<Q", file.read(8))[0]
    return file.read(length).decode("utf-8")


def _scalar(file, kind: int):
    code = SCALARS[kind]
    return struct.unpack(f"<{code}", file.read(struct.calcsize(code)))[0]


def _skip(file, kind: int) -> None:
    if kind in SCALARS:
        file.seek(struct.calcsize(SCALARS[kind]), 1)
    elif kind == STRING:
        file.seek(struct.unpack("<Q", file.read(8))[0], 1)
    elif kind == ARRAY:
        element, length = struct.unpack("<IQ", file.read(12))
        if element in SCALARS:
            file.seek(length * struct.calcsize(SCALARS[element]), 1)
        else:
            for _ in range(length):
                _skip(file, element)
    else:
        raise ValueError(f"unknown GGUF value type {kind}")


def _config_context(config_path: Path) -> int | None:
    """``max_position_embeddings`` of a Hugging Face ``config.json`` (its text model's, for
    a model with several)."""
    config = json.loads(config_path.read_text(encoding="utf-8"))
    text = config.get("text_config") or config
    value = text.get("max_position_embeddings")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
