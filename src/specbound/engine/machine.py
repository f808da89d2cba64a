"""What identifies this machine and a file on it, for the caches keyed by them (the cost book,
the AMX probe's verdicts): the processor's model and flags, and a file's identity. Plain
Python, no torch: the AMX probe's parent reads them before any model loads."""

from __future__ import annotations

import hashlib
import platform
from pathlib import Path


def cpu_description() -> dict:
    """The processor's model name and flags, from /proc/cpuinfo (what ``lscpu`` prints)."""
    description = {"model": platform.processor() or platform.machine(), "flags": ""}
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return description
    for line in lines:
        key, _, value = line.partition(":")
        field = {"model name": "model", "flags": "flags"}.get(key.strip())
        if field and not description.get(f"_{field}"):
            description[field], description[f"_{field}"] = value.strip(), True
    return {"model": description["model"], "flags": description["flags"]}


def file_fingerprint(path: Path) -> str:
    """Name, size and modification time of a file: enough to tell one model file (or one
    build of a library) from another without reading a gigabyte."""
    status = path.stat()
    return hashlib.sha256(f"{path.resolve()}:{status.st_size}:{status.st_mtime_ns}".encode()).hexdigest()[:16]
