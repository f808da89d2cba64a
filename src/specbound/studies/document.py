"""A tiny document model for the study report, rendered twice: Markdown and HTML.

Study modules build their report sections from these blocks (``Study.report_blocks``);
``specbound.studies.report`` assembles and renders them. Cells holding a (mean, standard
error) pair print as "m ± se".
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Paragraph:
    text: str  # `code` spans allowed


@dataclass(frozen=True)
class Bullets:
    items: list  # `code` spans allowed


@dataclass(frozen=True)
class Table:
    headers: list
    rows: list


@dataclass(frozen=True)
class Image:
    path: str  # relative to the report
    caption: str


def estimate(value, digits: int = 4) -> str:
    """(mean, se[, count]) -> "mean ± se"; a lone number prints with ``digits`` decimals."""
    if value is None:
        return "—"
    if isinstance(value, tuple):
        mean, error = round(value[0], digits) + 0.0, value[1]  # + 0.0: no "-0.0000"
        if math.isnan(error):
            return f"{mean:.{digits}f}"
        return f"{mean:.{digits}f} ± {error:.{digits}f}"
    if isinstance(value, float):
        return "∞" if math.isinf(value) else f"{round(value, digits) + 0.0:.{digits}f}"
    return str(value)


def slug(text: str) -> str:
    """A file-name-safe version of ``text``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def _cell(value) -> str:
    return estimate(value) if not isinstance(value, str) else value


def to_markdown(blocks) -> str:
    lines = []
    for block in blocks:
        if isinstance(block, Heading):
            lines += ["#" * block.level + " " + block.text, ""]
        elif isinstance(block, Paragraph):
            lines += [block.text, ""]
        elif isinstance(block, Bullets):
            lines += [f"- {item}" for item in block.items] + [""]
        elif isinstance(block, Table):
            lines.append("| " + " | ".join(map(str, block.headers)) + " |")
            lines.append("|" + "---|" * len(block.headers))
            for row in block.rows:
                lines.append("| " + " | ".join(_cell(value).replace("|", "\\|") for value in row) + " |")
            lines.append("")
        elif isinstance(block, Image):
            lines += [f"![{block.caption}]({block.path})", "", f"*{block.caption}*", ""]
    return "\n".join(lines)


def _inline_html(text: str) -> str:
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text, quote=False))


def to_html(blocks, title: str) -> str:
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;line-height:1.45}"
        "table{border-collapse:collapse;margin:1em 0;font-size:0.9em}"
        "td,th{border:1px solid #bbb;padding:3px 8px;text-align:right}th{background:#eee}"
        "td:first-child,th:first-child{text-align:left}img{max-width:100%}"
        "figcaption{font-style:italic;color:#444}code{background:#f4f4f4}</style>",
        "</head><body>",
    ]
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"<h{block.level}>{_inline_html(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            parts.append(f"<p>{_inline_html(block.text)}</p>")
        elif isinstance(block, Bullets):
            parts.append("<ul>" + "".join(f"<li>{_inline_html(item)}</li>" for item in block.items) + "</ul>")
        elif isinstance(block, Table):
            parts.append("<table><tr>" + "".join(f"<th>{html.escape(str(h))}</th>" for h in block.headers) + "</tr>")
            for row in block.rows:
                parts.append("<tr>" + "".join(f"<td>{html.escape(_cell(value))}</td>" for value in row) + "</tr>")
            parts.append("</table>")
        elif isinstance(block, Image):
            parts.append(f'<figure><img src="{html.escape(block.path)}" alt="{html.escape(block.caption)}">'
                         f"<figcaption>{html.escape(block.caption)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)
