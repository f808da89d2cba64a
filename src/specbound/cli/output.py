"""Plain-text tables, JSON output and output folders shared by every command."""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import textwrap
from pathlib import Path

WORK_LIMIT_NOTE = textwrap.fill(  # wrapped for the help texts printed as they are
    "Work is estimated before it starts, from per-operation costs kept as constants (specbound.work_limits, "
    "not measured on this machine), and refused above 30 s or 2 GiB; the environment variables "
    "SPECBOUND_WORK_LIMIT_SECONDS and SPECBOUND_WORK_LIMIT_BYTES raise the limits.", 88)


def format_table(headers: list[str], rows: list[list]) -> str:
    """Align columns; floats print with 6 decimals, None as an em dash."""

    def cell(value):
        if value is None:
            return "—"
        if isinstance(value, float):
            return f"{value:.6f}"
        return str(value)

    text_rows = [[cell(value) for value in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in text_rows)) for i, h in enumerate(headers)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(headers, widths))]
    lines.append("  ".join("-" * w for w in widths))
    for row in text_rows:
        lines.append("  ".join(value.ljust(w) for value, w in zip(row, widths)))
    return "\n".join(lines)


def print_json(payload) -> None:
    json.dump(payload, sys.stdout, indent=2)
    sys.stdout.write("\n")


def writable_folder(path: str, option: str, keep: bool = True) -> Path:
    """The folder ``path``, created with its parents and shown to take a file, before any
    work is done in it; ValueError naming ``option`` (its flag) when it cannot be. Without
    ``keep``, the folders it created are removed again: a command that checks more of its
    input first creates the folder once all of it is valid."""
    folder = Path(path)
    created = []
    try:
        created = [each for each in (folder, *folder.parents) if not each.exists()]  # the deepest first
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as error:
        raise ValueError(f"{option.lstrip('-').replace('-', '_')}: cannot write into {path!r} "
                         f"({error.strerror or error}); choose another {option}") from None
    finally:
        for each in created if not keep else []:
            with contextlib.suppress(OSError):  # a folder another process has filled meanwhile stays
                each.rmdir()
    return folder
