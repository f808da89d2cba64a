"""Append-only JSONL results of a study, resumable: an interrupted run loses nothing.

A study's results directory holds
- ``settings.json``: what was run (study, dataset, models, processing, seed, ...), written
  once; a later run into the same directory must have the same settings (``limit`` may
  differ: a larger one extends the results, a smaller one reads back a subset);
- ``records.jsonl``: one JSON object per line, in **units** (one engine generation for one
  prompt at one setting): the unit's ``position`` records, then its closing ``run`` record.
  A unit is written with one write and flushed; it is done once its run record is on disk;
- ``timings.jsonl``: wall-clock seconds per unit, kept apart so that the records are a
  function of the settings and the seed alone.

Resume: opening a directory cuts ``records.jsonl`` after the last complete run record (a
torn last line or a unit without its run record comes from an interrupted write) and reads
back which units are done. Each unit draws its randomness from its own seed
(``unit_seed``), so an interrupted-and-resumed run writes the same records, byte for byte,
as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

SETTINGS_FILE = "settings.json"
RECORDS_FILE = "records.jsonl"
TIMINGS_FILE = "timings.jsonl"
EXTENDABLE_SETTINGS = ("limit",)


def unit_seed(seed: int, unit: str) -> int:
    """A 63-bit seed for one unit from the study's seed and the unit's key (SHA-256, so it
    does not depend on the order units run in, nor on Python's hash randomisation)."""
    digest = hashlib.sha256(f"{seed}:{unit}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & (2**63 - 1)


def _dumps(record: dict) -> str:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def _normalised(settings: dict) -> dict:
    """Settings as JSON reads them back (tuples become lists), limit removed."""
    plain = json.loads(json.dumps(settings))
    return {key: value for key, value in plain.items() if key not in EXTENDABLE_SETTINGS}


class ResultsStore:
    """Writer of one study's results directory (see the module docstring)."""

    def __init__(self, directory, settings: dict):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        settings_path = self.directory / SETTINGS_FILE
        if settings_path.is_file():
            stored = json.loads(settings_path.read_text())
            if _normalised(stored) != _normalised(settings):
                differing = sorted(
                    key for key in _normalised(stored).keys() | _normalised(settings).keys()
                    if _normalised(stored).get(key) != _normalised(settings).get(key)
                )
                raise ValueError(
                    f"out: {self.directory} holds results of different settings "
                    f"({', '.join(differing)} differ); choose another --out or delete it"
                )
        settings_path.write_text(json.dumps(settings, indent=2, ensure_ascii=False) + "\n")
        self.records_path = self.directory / RECORDS_FILE
        self.timings_path = self.directory / TIMINGS_FILE
        self.done = _repair(self.records_path)

    def append_unit(self, unit: str, positions: list[dict], run: dict, seconds: dict) -> None:
        """Append one unit's position records and its closing run record, then its timing."""
        if unit in self.done:
            raise ValueError(f"unit: {unit!r} is already in {self.records_path}")
        lines = [_dumps({"unit": unit, "kind": "position", **record}) for record in positions]
        lines.append(_dumps({"unit": unit, "kind": "run", **run}))
        _append(self.records_path, "".join(line + "\n" for line in lines))
        self.done.add(unit)
        _append(self.timings_path, _dumps({"unit": unit, "seconds": seconds}) + "\n")


def _append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def _repair(path: Path) -> set[str]:
    """Cut ``path`` after its last complete run record; return the done units."""
    if not path.is_file():
        return set()
    done, keep = set(), 0
    with open(path, "rb") as handle:
        offset = 0
        for line in handle:
            offset += len(line)
            if not line.endswith(b"\n"):
                break
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                break
            if record.get("kind") == "run":
                done.add(record["unit"])
                keep = offset
    if keep < path.stat().st_size:
        with open(path, "r+b") as handle:
            handle.truncate(keep)
    return done


@dataclass
class StudyResults:
    """One study's results read back: settings, position and run records, timings."""

    directory: Path
    settings: dict
    positions: list[dict]
    runs: list[dict]
    timings: dict[str, dict]  # unit -> seconds by phase

    @property
    def total_seconds(self) -> float:
        return sum(seconds.get("total", 0.0) for seconds in self.timings.values())


def read_results(directory) -> StudyResults:
    """Read a results directory; units without their run record are left out.
    Raises ValueError when ``directory`` has no ``settings.json``."""
    directory = Path(directory)
    settings_path = directory / SETTINGS_FILE
    if not settings_path.is_file():
        raise ValueError(f"results: {directory} has no {SETTINGS_FILE}; not a study's results")
    positions, runs = [], []
    records_path = directory / RECORDS_FILE
    if records_path.is_file():
        pending = []
        with open(records_path, encoding="utf-8") as handle:
            for line in handle:
                if not line.endswith("\n"):
                    break
                record = json.loads(line)
                if record["kind"] == "run":
                    positions += [item for item in pending if item["unit"] == record["unit"]]
                    runs.append(record)
                    pending = []
                else:
                    pending.append(record)
    timings = {}
    timings_path = directory / TIMINGS_FILE
    if timings_path.is_file():
        with open(timings_path, encoding="utf-8") as handle:
            for line in handle:
                if line.endswith("\n"):
                    entry = json.loads(line)
                    timings[entry["unit"]] = entry["seconds"]
    return StudyResults(directory, json.loads(settings_path.read_text()), positions, runs, timings)
