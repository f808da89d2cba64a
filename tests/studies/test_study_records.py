"""Results are append-only and resumable: an interrupted study, resumed, writes exactly the
records of an uninterrupted one, byte for byte. One run writes a folder at a time; a torn
last line of any JSONL file is cut before the next append; settings are never half-written.
(Kills at random moments: ``test_crash_consistency``.)"""

import builtins
import contextlib
import json
import os
import resource
import signal
import threading

import pytest

from specbound.studies import records as records_module
from specbound.studies.acceptance import AcceptanceStudy
from specbound.studies.records import (RECORDS_FILE, SETTINGS_FILE, TIMINGS_FILE, ResultsStore, read_results,
                                       unit_seed)
from specbound.studies.runner import run_study
from specbound.models.tiny import tiny_pair, tiny_prompts

PROMPTS = 4


class Interrupted(Exception):
    pass


class InterruptedStudy(AcceptanceStudy):
    """Stops (as Ctrl-C would) when it reaches unit number ``stop_at``."""

    def __init__(self, stop_at, **options):
        super().__init__(**options)
        self.stop_at, self.started = stop_at, 0

    def run_units(self, pair, units, generators):
        self.started += len(units)
        if self.started >= self.stop_at:
            raise Interrupted
        return super().run_units(pair, units, generators)


OPTIONS = {"temperatures": (0.8, 1.0), "num_drafts": (2,), "max_new_tokens": 5}


def test_resumed_study_writes_the_records_of_an_uninterrupted_one(tmp_path):
    pair, prompts = tiny_pair(), tiny_prompts(PROMPTS)
    run_study(AcceptanceStudy(**OPTIONS), pair, prompts, tmp_path / "whole", "toy", progress=False)
    expected = (tmp_path / "whole" / RECORDS_FILE).read_bytes()

    interrupted = tmp_path / "interrupted"
    with pytest.raises(Interrupted):
        run_study(InterruptedStudy(4, **OPTIONS), pair, prompts, interrupted, "toy", progress=False)
    records = interrupted / RECORDS_FILE
    assert len(read_results(interrupted).runs) == 3
    # the fourth unit cut short while being written: its position lines, then a torn run line
    whole_lines = expected.decode().splitlines(keepends=True)
    units = list(dict.fromkeys(json.loads(line)["unit"] for line in whole_lines))
    unit_lines = [line for line in whole_lines if json.loads(line)["unit"] == units[3]]
    with open(records, "a", encoding="utf-8") as handle:
        handle.write("".join(unit_lines[:-1]) + unit_lines[-1][:17])

    results = run_study(AcceptanceStudy(**OPTIONS), pair, prompts, interrupted, "toy", progress=False)
    assert records.read_bytes() == expected
    assert len(results.runs) == 2 * PROMPTS
    assert len(read_results(interrupted).timings) == 2 * PROMPTS


def test_a_rerun_skips_finished_units_and_a_larger_limit_extends(tmp_path):
    pair = tiny_pair()
    run_study(AcceptanceStudy(**OPTIONS), pair, tiny_prompts(2), tmp_path, "toy", progress=False)
    before = (tmp_path / RECORDS_FILE).read_bytes()
    run_study(AcceptanceStudy(**OPTIONS), pair, tiny_prompts(2), tmp_path, "toy", progress=False)
    assert (tmp_path / RECORDS_FILE).read_bytes() == before
    results = run_study(AcceptanceStudy(**OPTIONS), pair, tiny_prompts(3), tmp_path, "toy", progress=False)
    assert (tmp_path / RECORDS_FILE).read_bytes().startswith(before)
    assert len(results.runs) == 6


def test_results_of_other_settings_are_not_mixed_in(tmp_path):
    pair = tiny_pair()
    run_study(AcceptanceStudy(**OPTIONS), pair, tiny_prompts(1), tmp_path, "toy", progress=False)
    with pytest.raises(ValueError, match="max_new_tokens"):
        run_study(AcceptanceStudy(**{**OPTIONS, "max_new_tokens": 6}), pair, tiny_prompts(1), tmp_path, "toy",
                  progress=False)


SETTINGS = {"study": "x", "limit": 1}
UNIT = ([{"position": 0}, {"position": 1}], {"tokens": [1, 2]}, {"total": 0.1})


def test_a_unit_is_written_once(tmp_path):
    with ResultsStore(tmp_path, SETTINGS) as store:
        store.append_unit("a", *UNIT)
        with pytest.raises(ValueError, match="unit"):
            store.append_unit("a", [], {}, {})


def test_a_second_writer_is_refused_while_the_first_holds_the_folder(tmp_path):
    pair, prompts = tiny_pair(), tiny_prompts(1)
    with ResultsStore(tmp_path, SETTINGS) as first:
        with pytest.raises(ValueError, match=r"in use by another run \(lock .*\.lock\); wait for it or choose"):
            ResultsStore(tmp_path, SETTINGS)
        with pytest.raises(ValueError, match="in use by another run"):
            run_study(AcceptanceStudy(**OPTIONS), pair, prompts, tmp_path, "toy", progress=False)
        first.append_unit("a", *UNIT)
    with pytest.raises(ValueError, match="closed"):
        first.append_unit("b", *UNIT)
    with ResultsStore(tmp_path, SETTINGS) as second:  # released on close
        assert second.done == {"a"}


class PausedWrite:
    """A file whose next write stops halfway until ``resume`` is set: a run caught mid-write."""

    def __init__(self, handle, halfway: threading.Event, resume: threading.Event):
        self.handle, self.halfway, self.resume = handle, halfway, resume

    def write(self, text):
        middle = len(text) // 2
        self.handle.write(text[:middle])
        self.handle.flush()
        self.halfway.set()
        self.resume.wait(timeout=30)
        return self.handle.write(text[middle:]) + middle

    def __getattr__(self, name):
        return getattr(self.handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exception):
        self.handle.close()


def test_a_second_run_cannot_cut_a_unit_being_written(tmp_path, monkeypatch):
    """The race of two runs: opening the folder while the other run's unit was half on disk cut
    those bytes, the rest of the write then landed as a fragment, and the next resume cut the
    fragment together with every finished unit after it."""
    halfway, resume = threading.Event(), threading.Event()
    records = tmp_path / RECORDS_FILE

    def paused_open(file, mode="r", *args, **kwargs):
        handle = builtins.open(file, mode, *args, **kwargs)
        return PausedWrite(handle, halfway, resume) if file == records and "a" in mode else handle

    with ResultsStore(tmp_path, SETTINGS) as first:
        first.append_unit("a", *UNIT)
        monkeypatch.setattr(records_module, "open", paused_open, raising=False)
        writer = threading.Thread(target=first.append_unit, args=("b", *UNIT))
        writer.start()
        assert halfway.wait(timeout=30)
        on_disk = records.read_bytes()
        try:
            with pytest.raises(ValueError, match="in use by another run"):
                ResultsStore(tmp_path, SETTINGS)
            assert records.read_bytes() == on_disk  # the second run cut nothing
        finally:
            resume.set()
            writer.join()
        monkeypatch.undo()
        first.append_unit("c", *UNIT)
    with ResultsStore(tmp_path, SETTINGS) as resumed:
        assert resumed.done == {"a", "b", "c"}
    assert [run["unit"] for run in read_results(tmp_path).runs] == ["a", "b", "c"]


def test_a_torn_timings_line_is_cut_before_the_next_append(tmp_path):
    with ResultsStore(tmp_path, SETTINGS) as store:
        store.append_unit("a", *UNIT)
    with open(tmp_path / TIMINGS_FILE, "a", encoding="utf-8") as handle:
        handle.write('{"unit":"b","seco')  # a run killed while writing b's timing (b's records are cut too)
    with ResultsStore(tmp_path, SETTINGS) as store:
        store.append_unit("b", *UNIT)
    assert read_results(tmp_path).timings == {"a": {"total": 0.1}, "b": {"total": 0.1}}
    assert [json.loads(line)["unit"] for line in (tmp_path / TIMINGS_FILE).read_text().splitlines()] == ["a", "b"]


def test_a_torn_records_line_is_cut_before_the_next_append(tmp_path):
    with ResultsStore(tmp_path, SETTINGS) as store:
        store.append_unit("a", *UNIT)
    whole = (tmp_path / RECORDS_FILE).read_bytes()
    with open(tmp_path / RECORDS_FILE, "ab") as handle:
        handle.write(b'{"unit":"b","kind":"position","position":0}\n{"unit":"b","kind":"ru')
    with ResultsStore(tmp_path, SETTINGS) as store:
        assert store.done == {"a"} and (tmp_path / RECORDS_FILE).read_bytes() == whole
        store.append_unit("b", *UNIT)
    results = read_results(tmp_path)
    assert [run["unit"] for run in results.runs] == ["a", "b"]
    assert [position["unit"] for position in results.positions] == ["a", "a", "b", "b"]


def test_a_timing_without_its_unit_is_ignored_by_readers_and_dropped_on_repair(tmp_path):
    with ResultsStore(tmp_path, SETTINGS) as store:
        store.append_unit("a", *UNIT)
    with open(tmp_path / TIMINGS_FILE, "a", encoding="utf-8") as handle:
        handle.write('{"unit":"ghost","seconds":{"total":100.0}}\n')
    assert read_results(tmp_path).timings == {"a": {"total": 0.1}}
    assert read_results(tmp_path).total_seconds == 0.1
    with ResultsStore(tmp_path, SETTINGS):
        pass
    assert "ghost" not in (tmp_path / TIMINGS_FILE).read_text()


def test_readers_skip_torn_last_lines_change_nothing_and_never_wait_for_the_writer(tmp_path):
    with ResultsStore(tmp_path, SETTINGS) as store:
        store.append_unit("a", *UNIT)
        with open(tmp_path / RECORDS_FILE, "ab") as handle:
            handle.write(b'{"unit":"b","kind":"position","position":0}\n{"unit":"b","kind":"ru')
        with open(tmp_path / TIMINGS_FILE, "ab") as handle:
            handle.write(b'{"unit":"b","seco')
        files = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
        results = read_results(tmp_path)  # while the writer holds the folder
        assert [run["unit"] for run in results.runs] == ["a"] and list(results.timings) == ["a"]
        assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == files


def test_a_damaged_line_with_finished_units_after_it_is_refused_not_cut(tmp_path):
    """A crash can only cut the last write short; a broken line in the middle is damage, and
    cutting there would drop every finished unit after it."""
    with ResultsStore(tmp_path, SETTINGS) as store:
        store.append_unit("a", *UNIT)
    records = tmp_path / RECORDS_FILE
    records.write_bytes(records.read_bytes() + b'{"unit":"b","kind":"ru{"unit":"x"}\n' + records.read_bytes()
                        .replace(b'"a"', b'"c"'))
    damaged = records.read_bytes()
    with pytest.raises(ValueError, match=r"records.jsonl line 4 is damaged"):
        ResultsStore(tmp_path, SETTINGS)
    with pytest.raises(ValueError, match=r"records.jsonl line 4 is damaged"):
        read_results(tmp_path)
    assert records.read_bytes() == damaged


@contextlib.contextmanager
def file_size_limit(size: int):
    """Writes past ``size`` bytes fail (EFBIG), as on a full disk: a write cut short."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def test_settings_are_never_left_half_written(tmp_path):
    settings = {**SETTINGS, "models": {"target": "t" * 300, "draft": "d" * 300}}
    with file_size_limit(200), pytest.raises(OSError):
        ResultsStore(tmp_path / "new", settings)
    assert not (tmp_path / "new" / SETTINGS_FILE).exists()
    with ResultsStore(tmp_path / "new", settings):
        pass
    with ResultsStore(tmp_path / "extended", settings):
        pass
    stored = (tmp_path / "extended" / SETTINGS_FILE).read_bytes()
    with file_size_limit(200), pytest.raises(OSError):
        ResultsStore(tmp_path / "extended", {**settings, "limit": 2})  # a larger limit rewrites them
    assert (tmp_path / "extended" / SETTINGS_FILE).read_bytes() == stored
    assert read_results(tmp_path / "new").settings == read_results(tmp_path / "extended").settings == settings
    assert sorted(path.name for path in (tmp_path / "extended").iterdir()) == [".lock", SETTINGS_FILE]


def test_unchanged_settings_are_not_rewritten(tmp_path):
    with ResultsStore(tmp_path, SETTINGS):
        pass
    os.utime(tmp_path / SETTINGS_FILE, ns=(0, 0))
    with ResultsStore(tmp_path, SETTINGS):
        pass
    assert (tmp_path / SETTINGS_FILE).stat().st_mtime_ns == 0
    with ResultsStore(tmp_path, {**SETTINGS, "limit": 2}):
        pass
    assert json.loads((tmp_path / SETTINGS_FILE).read_text())["limit"] == 2


def test_unit_seeds_depend_on_seed_and_unit_only():
    assert unit_seed(0, "toy/1|T=0.7") == unit_seed(0, "toy/1|T=0.7")
    assert len({unit_seed(0, "a"), unit_seed(1, "a"), unit_seed(0, "b")}) == 3
    assert 0 <= unit_seed(5, "a") < 2**63


def test_reading_a_folder_without_settings_fails(tmp_path):
    with pytest.raises(ValueError, match="settings.json"):
        read_results(tmp_path)


@pytest.mark.parametrize("stored", [[1, 2], "settings", None])
def test_settings_that_are_not_a_json_object_are_refused_by_readers_and_writers(stored, tmp_path):
    """The one read of settings.json checks that it is an object: ``read_results`` used to
    hand back [1, 2] as settings, and a store over it failed with AttributeError."""
    path = tmp_path / SETTINGS_FILE
    path.write_text(json.dumps(stored))
    with pytest.raises(ValueError, match="holds no study's settings") as from_reader:
        read_results(tmp_path)
    with pytest.raises(ValueError, match="holds no study's settings") as from_writer:
        ResultsStore(tmp_path, SETTINGS).close()
    for refusal in (from_reader, from_writer):
        assert str(path) in str(refusal.value) and "\n" not in str(refusal.value)
    assert json.loads(path.read_text()) == stored  # refused, not overwritten


def test_a_batched_study_writes_the_records_of_a_one_by_one_run(tmp_path):
    """Units decoded 3 at a time (a batch cut where the temperature changes) generate the
    same tokens as units decoded one by one, and their exact numbers agree to float32
    rounding: a batched target forward rounds its last bits differently from a lone one."""
    pair, prompts = tiny_pair(), tiny_prompts(PROMPTS)
    for name, size in (("one", 1), ("batched", 3)):
        run_study(AcceptanceStudy(**OPTIONS), pair, prompts, tmp_path / name, "toy", progress=False, batch_size=size)
    one, batched = read_results(tmp_path / "one"), read_results(tmp_path / "batched")
    assert [run["tokens"] for run in batched.runs] == [run["tokens"] for run in one.runs]
    assert [run["unit"] for run in batched.runs] == [run["unit"] for run in one.runs]
    assert len(batched.positions) == len(one.positions)
    for first, second in zip(one.positions, batched.positions):
        assert first["token"] == second["token"]
        for method, value in first["acceptance"].items():
            assert second["acceptance"][method] == pytest.approx(value, abs=1e-6)
    assert set(batched.timings) == {run["unit"] for run in batched.runs}
