"""Plain-text tables and JSON output shared by every command."""

from __future__ import annotations

import json
import sys


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
