"""Append-only JSONL results of a study, resumable: an interrupted run loses nothing.

A study's results directory holds
- ``settings.json``: what was run (study, dataset, models, processing, seed, ...); a later
  run into the same directory must have the same settings (``limit`` may differ: a larger
  one extends the results, a smaller one reads back a subset). It is written only when it
  changes, and atomically (a temporary file in the folder, synced, renamed over it), so it
  is never half-written;
- ``records.jsonl``: one JSON object per line, in **units** (one engine generation for one
  prompt at one setting): the unit's ``position`` records, then its closing ``run`` record.
  A unit is written with one write and synced; it is done once its run record is on disk;
- ``timings.jsonl``: wall-clock seconds per unit, appended after its records, kept apart so
  that the records are a function of the settings and the seed alone;
- ``.lock``: the lock (``filelock``; ``flock`` on POSIX) that the one run writing the folder
  holds from opening it to closing it. A second run is refused at once; the OS releases the
  lock when its holder dies, even by SIGKILL.

Crash consistency: every write is an append made under the lock after the previous one was
synced, so a crash (or kill) can only cut the last write short. Opening a directory to write
repairs both JSONL files the same way, under the lock: a torn last line (no newline, or not
JSON) is cut; ``records.jsonl`` is cut after its last complete run record (a unit without
its run record was interrupted), and a timing of a unit that is not in the records is
dropped. A broken line with complete lines after it is damage, not a write cut short: it is
refused, never cut (cutting there would drop every finished unit after it). Readers
(``read_results``) take no lock and change nothing: they skip a torn last line and the units
without their run record.

Checked as read: every complete line, by readers and by the repair alike, must be a record
of its file — in ``records.jsonl`` a ``unit`` string, a ``kind`` "position" or "run" and
the fields its study declares with their kinds (``RecordFields``, ``Study.record_fields``);
in ``timings.jsonl`` a ``unit`` and its ``seconds`` — and no unit may hold a record after
its run record, nor two position records with the same key (a copied line). A crash cannot
write such a line, so it is refused with its file and line number, never counted. Readers
check the settings of a study they know the same way.

Resume: the repaired directory says which units are done. Each unit draws its randomness
from its own seed (``unit_seed``), so an interrupted-and-resumed run writes the same
records, byte for byte, as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from specbound.studies.fields import INTEGER, MAPPING, NUMBER, TEXT, Kind, RecordFields, mapping_of
from specbound.studies.options import STUDY_OPTIONS

SETTINGS_FILE = "settings.json"
RECORDS_FILE = "records.jsonl"
TIMINGS_FILE = "timings.jsonl"
LOCK_FILE = ".lock"
EXTENDABLE_SETTINGS = ("limit",)


def unit_seed(seed: int, unit: str) -> int:
    """A 63-bit seed for one unit from the study's seed and the unit's key (SHA-256, so it
    does not depend on the order units run in, nor on Python's hash randomisation)."""
    digest = hashlib.sha256(f"{seed}:{unit}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & (2**63 - 1)


def _dumps(record: dict) -> str:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


ENVELOPE = {"unit": TEXT}  # what records.py itself writes into every line, besides the kind
SETTINGS_FIELDS = {"study": TEXT, "dataset": TEXT, "seed": INTEGER, "limit": INTEGER, "models": MAPPING}  # of all studies
TIMING_FIELDS = {"unit": TEXT, "seconds": mapping_of(NUMBER)}
KINDS = ("position", "run")


def _normalised(settings: dict) -> dict:
    """Settings as JSON reads them back (tuples become lists), limit removed."""
    plain = json.loads(json.dumps(settings))
    return {key: value for key, value in plain.items() if key not in EXTENDABLE_SETTINGS}


class ResultsStore:
    """The one writer of a study's results directory (see the module docstring): it holds
    the folder's lock from opening to ``close`` (or the end of its ``with`` block).

    With ``later``, the names of settings not known yet (the models, described once they
    have loaded), it takes the lock, checks the other settings against the stored ones and
    repairs the records — everything that can refuse a run before a model loads — and
    ``store_settings`` completes them; units are appended once the settings are stored."""

    def __init__(self, directory, settings: dict, later: tuple[str, ...] = ()):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.records_path = self.directory / RECORDS_FILE
        self.timings_path = self.directory / TIMINGS_FILE
        self.settings_path = self.directory / SETTINGS_FILE
        self.settings_stored = False
        self._lock = _lock(self.directory)
        try:
            if later:
                _check_settings(self.settings_path, settings, later)
            else:
                self.store_settings(settings)
            self.done = _repair_records(self.records_path, settings)
            _repair_timings(self.timings_path, self.done)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exception) -> None:
        self.close()

    def close(self) -> None:
        """Release the folder: another run may write it from now on."""
        self._lock.release()

    def store_settings(self, settings: dict) -> None:
        """Check the complete ``settings`` against the stored ones; store them when new or extended."""
        _store_settings(self.settings_path, settings)
        self.settings_stored = True

    def append_unit(self, unit: str, positions: list[dict], run: dict, seconds: dict) -> None:
        """Append one unit's position records and its closing run record, then its timing."""
        if not self._lock.is_locked:
            raise ValueError(f"results: the store of {self.directory} is closed; open it again to write")
        if not self.settings_stored:
            raise ValueError(f"results: the settings of {self.directory} are not stored yet (store_settings)")
        if unit in self.done:
            raise ValueError(f"unit: {unit!r} is already in {self.records_path}")
        lines = [_dumps({"unit": unit, "kind": "position", **record}) for record in positions]
        lines.append(_dumps({"unit": unit, "kind": "run", **run}))
        _append(self.records_path, "".join(line + "\n" for line in lines))
        self.done.add(unit)
        _append(self.timings_path, _dumps({"unit": unit, "seconds": seconds}) + "\n")


def check_free(directory) -> None:
    """Refuse, as ``ResultsStore`` would, a results folder another run holds now, keeping
    no lock: a first look before the study and its models load (the store takes the lock
    for the run when it opens)."""
    directory = Path(directory)
    if (directory / LOCK_FILE).exists():
        _lock(directory).release()


def _lock(directory: Path) -> FileLock:
    """The folder's lock, held; a ValueError at once when another run holds it."""
    path = directory / LOCK_FILE
    lock = FileLock(path, timeout=0, thread_local=False)
    try:
        lock.acquire()
    except Timeout:
        raise ValueError(
            f"out: {directory} is in use by another run (lock {path}); wait for it or choose another --out"
        ) from None
    return lock


def read_settings(path: Path, field: str = "results") -> dict:
    """The settings a study stored at ``path``: a JSON object. ValueError starting with
    ``field`` and naming the file when it is not UTF-8 JSON, or is JSON but no object."""
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:  # not UTF-8, or not JSON
        raise ValueError(f"{field}: {path} is not a JSON settings file ({error})") from None
    if not isinstance(settings, dict):
        raise ValueError(f"{field}: {path} holds no study's settings (a JSON object, not {type(settings).__name__}); "
                         "choose another folder or delete it")
    return settings


def _check_settings(path: Path, settings: dict, later: tuple[str, ...] = ()) -> None:
    """Refuse a folder whose stored settings differ from ``settings`` (the extendable ones
    aside, and those named in ``later``)."""
    if not path.is_file():
        return
    stored, wanted = _normalised(read_settings(path)), _normalised(settings)
    compared = (stored.keys() | wanted.keys()) - set(later)
    differing = sorted(key for key in compared if stored.get(key) != wanted.get(key))
    if differing:
        raise ValueError(
            f"out: {path.parent} holds results of different settings "
            f"({', '.join(differing)} differ); choose another --out or delete it"
        )


def _store_settings(path: Path, settings: dict) -> None:
    """Check ``settings`` against those stored at ``path``; write them when new or extended."""
    text = json.dumps(settings, indent=2, ensure_ascii=False) + "\n"
    _check_settings(path, settings)
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return
    _replace(path, text.encode())


def _append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def _replace(path: Path, data: bytes) -> None:
    """Replace ``path`` by ``data`` atomically: a reader, or a crash, sees the old file or the
    new one, never a mix (the temporary file's name is free: the caller holds the lock)."""
    temporary = path.with_name(path.name + ".tmp")
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself survives a power cut
    finally:
        os.close(folder)


def _parsed(line: bytes) -> dict | None:
    """One line as a record, or None when it is no record (a torn or broken line)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and "unit" in record else None


def _complete_lines(path: Path) -> list[tuple[int, dict, bytes]]:
    """The complete lines of a JSONL file, in order, each with its number, parsed and with its
    bytes (newline included); a torn last line is left out. Raises ValueError when a line
    that is no record has lines after it: that is damage, not a write cut short."""
    if not path.is_file():
        return []
    *lines, tail = path.read_bytes().split(b"\n")  # tail: what follows the last newline
    complete = []
    for number, line in enumerate(lines, 1):
        record = _parsed(line)
        if record is None:
            if number < len(lines) or tail:
                raise ValueError(
                    f"results: {path} line {number} is damaged (no complete JSON record, and lines follow it); "
                    "a crash only cuts the last line short, so nothing is cut: repair or remove that line by hand"
                )
            break
        complete.append((number, record, line + b"\n"))
    return complete


def declared_fields(settings: dict) -> tuple[str, RecordFields | None]:
    """The study ``settings`` name and its record fields (``options.STUDY_OPTIONS``, read
    without the studies); None for a study this version does not know (its records are
    checked for their envelope only)."""
    name = settings.get("study")
    study = STUDY_OPTIONS.get(name) if isinstance(name, str) else None
    return (str(name), None) if study is None else (name, study.record_fields)


def _check_fields(record: dict, kinds: dict[str, Kind], where: str, holder: str = "the record") -> None:
    for name, kind in kinds.items():
        if name not in record:
            raise ValueError(f"{where}: no {name!r} ({kind.phrase}), which {holder} holds; {_NOT_WRITTEN_HERE}")
        if not kind.accepts(record[name]):
            shown = json.dumps(record[name], ensure_ascii=False)
            shown = shown if len(shown) <= 40 else shown[:40] + "…"
            raise ValueError(f"{where}: {name!r} is {shown}, not {kind.phrase}; {_NOT_WRITTEN_HERE}")


_NOT_WRITTEN_HERE = "no study writes that, nor does a crash: repair it or remove it by hand"


def _checked_records(path: Path, settings: dict) -> list[tuple[dict, bytes]]:
    """``records.jsonl``'s complete lines, each checked (module docstring): a ``kind`` of
    "position" or "run", the envelope and the fields of that kind the study of ``settings``
    declares; no record of a unit after its run record, no two position records of one unit
    with equal keys. ValueError naming the file and line otherwise."""
    study, fields = declared_fields(settings)
    fields = fields or RecordFields()
    checked, closed, keys = [], {}, {}
    for number, record, line in _complete_lines(path):
        where = f"results: {path} line {number}"
        kind = record.get("kind")
        if not isinstance(kind, str) or kind not in KINDS:
            raise ValueError(f"{where}: the record's \"kind\" is {json.dumps(kind)}, not \"position\" or \"run\"; "
                             f"{_NOT_WRITTEN_HERE}")
        _check_fields(record, ENVELOPE | getattr(fields, kind), where, f"every {kind} record of the {study} study")
        unit = record["unit"]
        if unit in closed:
            raise ValueError(f"{where}: a {kind} record of unit {unit!r} after its run record (line {closed[unit]}): "
                             f"written twice; {_NOT_WRITTEN_HERE}")
        if kind == "run":
            closed[unit] = number
        elif fields.key:
            key = (unit, *(record[name] for name in fields.key))
            if key in keys:
                shown = ", ".join(f"{name} {record[name]!r}" for name in fields.key)
                raise ValueError(f"{where}: unit {unit!r} holds a second position record at {shown} (the first: "
                                 f"line {keys[key]}); {_NOT_WRITTEN_HERE}")
            keys[key] = number
        checked.append((record, line))
    return checked


def _checked_timings(path: Path) -> list[tuple[dict, bytes]]:
    """``timings.jsonl``'s complete lines, each checked to hold a unit and its seconds."""
    checked = []
    for number, record, line in _complete_lines(path):
        _check_fields(record, TIMING_FIELDS, f"results: {path} line {number}", "every timing")
        checked.append((record, line))
    return checked


def _repair_records(path: Path, settings: dict) -> set[str]:
    """Cut ``path`` after its last complete run record; return the done units."""
    done, size, keep = set(), 0, 0
    for record, line in _checked_records(path, settings):
        size += len(line)
        if record["kind"] == "run":
            done.add(record["unit"])
            keep = size
    if path.is_file() and path.stat().st_size > keep:
        os.truncate(path, keep)
    return done


def _repair_timings(path: Path, done: set[str]) -> None:
    """Keep the first complete timing of each done unit; drop a torn last line and the
    timings of units not in the records."""
    kept, timed = [], set()
    for record, line in _checked_timings(path):
        if record["unit"] in done and record["unit"] not in timed:
            kept.append(line)
            timed.add(record["unit"])
    if path.is_file() and path.stat().st_size != sum(map(len, kept)):
        _replace(path, b"".join(kept))


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
    """Read a results directory, taking no lock and changing nothing: a torn last line and
    the units without their run record are left out, and so are the timings of units not
    in the records. Raises ValueError when ``directory`` has no ``settings.json``, when a
    setting is not of the kind its study declares, and when a line is no record of its file
    (module docstring), naming the file (and line)."""
    directory = Path(directory)
    settings_path = directory / SETTINGS_FILE
    if not settings_path.is_file():
        raise ValueError(f"results: {directory} has no {SETTINGS_FILE}; not a study's results")
    settings = read_settings(settings_path)
    study, fields = declared_fields(settings)
    if fields is not None:
        _check_fields(settings, SETTINGS_FIELDS | fields.settings, f"results: {settings_path}",
                      f"the settings of every {study} study")
    positions, runs, pending = [], [], []
    for record, _ in _checked_records(directory / RECORDS_FILE, settings):
        if record["kind"] == "run":
            positions += [item for item in pending if item["unit"] == record["unit"]]
            runs.append(record)
            pending = []
        else:
            pending.append(record)
    done = {run["unit"] for run in runs}
    timings = {}
    for entry, _ in _checked_timings(directory / TIMINGS_FILE):
        if entry["unit"] in done:
            timings.setdefault(entry["unit"], entry["seconds"])
    return StudyResults(directory, settings, positions, runs, timings)


REPORT_FOLDER = "report"  # what ``specbound report`` writes below a results folder (``studies.report``)


def find_results(directory) -> list[StudyResults]:
    """Every study's results below ``directory`` (itself included), in study order."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"results: {directory} is not a directory")
    read = [read_results(path.parent) for path in sorted(directory.rglob(SETTINGS_FILE))
            if REPORT_FOLDER not in path.relative_to(directory).parts]
    found = [results for results in read if results.runs]
    if not found:
        unfinished = [str(results.directory) for results in read if _has_records(results.directory)]
        raise ValueError(
            f"results: no study results (a folder with {SETTINGS_FILE} and finished runs) below {directory}"
            + (f"; {', '.join(unfinished)} holds records but no run record (a line with \"kind\": \"run\"): "
               "an interrupted first unit, or records of another program or version" if unfinished else ""))
    unknown = sorted({r.settings.get("study") for r in found} - STUDY_OPTIONS.keys(), key=str)
    if unknown:
        raise ValueError(f"results: {directory} holds results of unknown studies {unknown}; "
                         f"known: {sorted(STUDY_OPTIONS)}")
    return sorted(found, key=lambda r: (STUDY_OPTIONS[r.settings["study"]].order, str(r.settings.get("dataset"))))


def _has_records(directory: Path) -> bool:
    records = directory / RECORDS_FILE
    return records.is_file() and records.stat().st_size > 0
