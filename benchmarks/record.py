"""One record format for every benchmark, and the one ``--output`` flag that names where it goes.

A record is one JSON envelope::

    {"benchmark": "benchmarks.engine.bench_engine",
     "command": "python -m benchmarks.engine.bench_engine --prompts humaneval ...",
     "commit": "4f6c308-dirty",
     "machine": {"cpu_model": ..., "cpu_flags": ..., "cores": 2, "python": ..., "packages": {...}},
     "created": "2026-12-07T15:40:00+00:00",
     "result": {...}}

A script that writes its record at the end calls ``write``. One that records each unit of work
as it finishes (and skips, when rerun, what the file already holds) writes JSON lines through
``Lines``: the envelope first, without its result, then one result a line; a rerun appends its
own envelope before its results. ``results`` reads the results back. The processor's model and
flags come from ``specbound.engine.machine.cpu_description``, the one place the library reads them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Iterator

from specbound.engine.machine import cpu_description

RESULTS = Path(__file__).resolve().parent / "results"
PACKAGES = ("specbound", "torch", "transformers", "llama_cpp_python", "numpy")


def package_version(name: str) -> str | None:
    """The installed distribution's version, None where it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@cache
def machine() -> dict:
    """The machine a benchmark ran on: processor model and flags, logical cores, Python and the
    versions of the packages whose code it timed; the GPU's name where torch sees one."""
    cpu = cpu_description()
    record = {"cpu_model": cpu["model"], "cpu_flags": cpu["flags"], "cores": os.cpu_count(),
              "python": platform.python_version(),
              "packages": {name: package_version(name) for name in PACKAGES}}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        record["gpu"] = torch.cuda.get_device_name(0)
    return record


@cache
def commit() -> str | None:
    """The checkout's commit (``-dirty`` with uncommitted changes), None outside a git checkout."""
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty"], cwd=RESULTS.parent, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def benchmark_name() -> str:
    """The running benchmark's module (``benchmarks.engine.bench_engine`` under ``python -m``)."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    return spec.name if spec is not None else Path(sys.argv[0]).stem


def envelope(result) -> dict:
    """``result`` in the envelope: which benchmark, the command line, the code, the machine, when."""
    name = benchmark_name()
    return {"benchmark": name, "command": shlex.join(["python", "-m", name, *sys.argv[1:]]), "commit": commit(),
            "machine": machine(), "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "result": result}


def add_output(parser: argparse.ArgumentParser, default: str | None, help: str = "where the record goes") -> None:
    """The ``--output`` flag: a path, ``default`` taken relative to ``benchmarks/results/`` (None:
    no record unless one is named)."""
    parser.add_argument("--output", type=Path, default=RESULTS / default if default else None,
                        help=f"{help} (default: {RESULTS.name}/{default})" if default else help)


def write(path: Path, result) -> dict:
    """Write ``result`` in its envelope to ``path`` as indented JSON (paths as strings); return
    the envelope."""
    record = envelope(result)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False, default=str) + "\n")
    return record


class Lines:
    """A JSON-lines record at ``path``: this run's envelope (without its result) on the line
    before its first result, then one result a line, each flushed as it comes."""

    def __init__(self, path: Path):
        self.path = path
        self.started = False

    def append(self, result) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as handle:
            if not self.started:
                header = envelope(None)
                del header["result"]
                handle.write(json.dumps(header, ensure_ascii=False, default=str) + "\n")
                self.started = True
            handle.write(json.dumps(result, ensure_ascii=False, default=str) + "\n")


def is_envelope(line: dict) -> bool:
    return "benchmark" in line and "machine" in line


def results(path: Path) -> Iterator[dict]:
    """The results of a JSON-lines record, in order, its envelopes left out (nothing where the
    file does not exist)."""
    if not path.exists():
        return
    with path.open() as handle:
        for line in handle:
            if line.strip() and not is_envelope(record := json.loads(line)):
                yield record
