"""A study killed (SIGKILL) at random moments, many times, then resumed, keeps every finished
unit exactly once: its records are those of an uninterrupted run, byte for byte, and so are
its report's tables.

A driver process imports specbound once and forks one worker per attempt (a fresh
interpreter per attempt would spend seconds importing torch before each kill). Each worker
resumes the study on the tiny models and reports its progress on stdout, one event per
line: ``unit`` before it computes a unit, ``wrote`` after each piece of a write. Writes
land in pieces, each flushed to the OS, as a slow disk takes a large write: a JSONL line in
two halves, any other file (``settings.json``'s temporary file) in two halves. A kill can
then tear a write anywhere: inside ``settings.json``, inside a line, between a unit's lines,
between its records and its timing, inside its timing. The test kills the worker after a
number of events drawn from a fixed seed, and checks that its kills landed in each of those
places and between units. A worker started while another process holds the folder is
refused."""

import collections
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from specbound.studies.acceptance import AcceptanceStudy
from specbound.studies.records import LOCK_FILE, RECORDS_FILE, SETTINGS_FILE, TIMINGS_FILE, ResultsStore, read_results
from specbound.studies.report import write_report
from specbound.studies.runner import run_study
from specbound.models.tiny import tiny_pair, tiny_prompts

TESTS = Path(__file__).resolve().parents[1]
SOURCE = TESTS.parent / "src"
OPTIONS = {"temperatures": (0.8, 1.0), "num_drafts": (2,), "max_new_tokens": 6}
PROMPTS = 16  # 32 units of 7 lines: about 17 events each
KILLS = 30
MOST_EVENTS_BEFORE_A_KILL = 36

DRIVER = textwrap.dedent('''
    import ast, builtins, os, sys, time

    import numpy as np

    from specbound.studies import records
    from specbound.studies.acceptance import AcceptanceStudy
    from specbound.studies.runner import run_study
    from specbound.models.tiny import VOCAB, tiny_pair, tiny_prompts

    prompts, options = int(sys.argv[1]), ast.literal_eval(sys.argv[2])


    def event(text):
        os.write(1, f"{text}\\n".encode())


    class PieceByPiece:
        """A file whose writes land in pieces, each flushed to the OS and reported."""

        def __init__(self, handle, lines):
            self.handle, self.lines = handle, lines

        def write(self, text):
            for part in text.splitlines(keepends=True) if self.lines else [text]:
                for piece in (part[: len(part) // 2], part[len(part) // 2 :]):
                    self.handle.write(piece)
                    self.handle.flush()
                    event("wrote")
                    time.sleep(0.005)  # the kill lands here
            return len(text)

        def __getattr__(self, name):
            return getattr(self.handle, name)

        def __enter__(self):
            return self

        def __exit__(self, *exception):
            self.handle.close()


    def piece_by_piece_open(file, mode="r", *args, **kwargs):
        handle = builtins.open(file, mode, *args, **kwargs)
        writes = set(mode) & set("wax+")
        return PieceByPiece(handle, lines=str(file).endswith(".jsonl")) if writes else handle


    records.open = piece_by_piece_open  # every write of the results store, and only those


    class ReportingStudy(AcceptanceStudy):
        def run_units(self, pair, units, generators):
            event("unit")
            return super().run_units(pair, units, generators)


    def work(out):
        import torch

        torch.set_num_threads(1)  # as in the test process, so the records are the same floats
        event(f"worker {os.getpid()}")
        run_study(ReportingStudy(**options), tiny_pair(), tiny_prompts(prompts), out, "toy", progress=False)


    # The exact part's compiled functions, loaded from numba's cache here once rather than in
    # every worker (each would spend most of its life loading them); numpy only, no torch.
    rows = np.random.default_rng(0).dirichlet(np.ones(VOCAB), size=(2, 3))
    AcceptanceStudy(**options).exact(rows[0], rows[1])

    event("ready")
    for out in sys.stdin:  # one worker per line, naming its results folder; torch runs in the workers only
        pid = os.fork()
        if pid == 0:
            try:
                work(out.strip())
            except BaseException as error:
                os.write(2, f"worker failed: {error!r}\\n".encode())
                os._exit(1)
            os._exit(0)
        event(f"exit {os.waitpid(pid, 0)[1]}")
''')


class Driver:
    """The driver process: ``attempt(out, kill_after)`` runs one worker on the results folder
    ``out``, SIGKILLs it after ``kill_after`` events (never when None) and returns its wait
    status."""

    def __init__(self, folder: Path):
        script = folder / "crash_driver.py"
        script.write_text(DRIVER)
        self.stderr = folder / "crash_driver.err"
        path = os.pathsep.join(map(str, (SOURCE, TESTS)))
        with open(self.stderr, "wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, str(script), str(PROMPTS), repr(OPTIONS)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                env={**os.environ, "PYTHONPATH": path},
            )
        self.watchdog = threading.Timer(300, self.process.kill)  # a hung driver fails the test, never stalls it
        self.watchdog.start()
        assert self.process.stdout.readline() == b"ready\n", self.errors()

    def attempt(self, out: Path, kill_after: int | None) -> int:
        self.process.stdin.write(f"{out}\n".encode())
        self.process.stdin.flush()
        worker, events = None, 0
        for line in self.process.stdout:
            word, _, value = line.decode().strip().partition(" ")
            if word == "worker":
                worker = int(value)
            elif word == "exit":
                return int(value)
            else:
                events += 1
                if events == kill_after:
                    os.kill(worker, signal.SIGKILL)
        self.process.kill()
        raise AssertionError(f"the driver stopped: {self.errors()}")

    def errors(self) -> str:
        return self.stderr.read_text()

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)
        self.watchdog.cancel()


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    driver = Driver(tmp_path_factory.mktemp("driver"))
    yield driver
    driver.close()


def killed(status: int) -> bool:
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def finished(status: int) -> bool:
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def where_the_kill_landed(out: Path) -> str:
    """What a killed worker left behind, read before the next one repairs it."""
    if not (out / SETTINGS_FILE).exists():
        return "before or inside settings.json"
    records = (out / RECORDS_FILE).read_bytes() if (out / RECORDS_FILE).exists() else b""
    timings = (out / TIMINGS_FILE).read_bytes() if (out / TIMINGS_FILE).exists() else b""
    if not records.endswith(b"\n") and records:
        return "inside a records line"
    if records and json.loads(records.splitlines()[-1])["kind"] != "run":
        return "between a unit's lines"
    if not timings.endswith(b"\n") and timings:
        return "inside a timing"
    if records and json.loads(records.splitlines()[-1])["unit"] not in {
            json.loads(line)["unit"] for line in timings.splitlines()}:
        return "between a unit's records and its timing"
    return "between units"


def report_tables(directory: Path) -> str:
    """The rendered report without what differs between runs: its timestamp line, the run
    time tables and the cost section computed from them (a unit killed between its records
    and its timing has no timing)."""
    markdown = write_report(directory).read_text()
    kept = [line for line in markdown.splitlines() if not line.startswith("Generated ")]
    for heading in ("## Models, settings and run time", "### Cost at the paper's scale"):
        start = kept.index(heading)
        end = next(index for index, line in enumerate(kept) if line.startswith("### ") and index > start)
        kept = kept[:start] + kept[end:]
    return "\n".join(kept)


def test_a_study_killed_at_random_moments_and_resumed_equals_an_uninterrupted_one(tmp_path, driver):
    whole = run_study(AcceptanceStudy(**OPTIONS), tiny_pair(), tiny_prompts(PROMPTS), tmp_path / "whole", "toy",
                      progress=False)
    out = tmp_path / "killed"
    statuses, landed = [], collections.Counter()
    kill_after = [1, *np.random.default_rng(20241130).integers(1, MOST_EVENTS_BEFORE_A_KILL + 1, size=KILLS - 1)]
    for events in kill_after:  # the first kill tears settings.json: its first half is on disk
        statuses.append(driver.attempt(out, int(events)))
        if killed(statuses[-1]):
            landed[where_the_kill_landed(out)] += 1
    statuses.append(driver.attempt(out, None))
    # every worker was killed or finished: none found the folder still locked by a killed one
    assert all(killed(status) or finished(status) for status in statuses), statuses
    assert finished(statuses[-1]) and sum(landed.values()) >= 2 * KILLS // 3
    assert len(landed) == 6, landed  # kills landed in every place a write can be torn, and between units

    lines = [json.loads(line) for line in (out / RECORDS_FILE).read_text().splitlines()]
    run_units = collections.Counter(line["unit"] for line in lines if line["kind"] == "run")
    assert set(run_units) == {run["unit"] for run in whole.runs} and set(run_units.values()) == {1}
    assert {line["unit"] for line in lines} == set(run_units)  # no position without its unit's run record
    assert (out / RECORDS_FILE).read_bytes() == (tmp_path / "whole" / RECORDS_FILE).read_bytes()
    timed = [json.loads(line)["unit"] for line in (out / TIMINGS_FILE).read_text().splitlines()]
    assert len(timed) == len(set(timed)) and set(timed) <= set(run_units)

    resumed = read_results(out)
    assert resumed.positions == whole.positions and resumed.runs == whole.runs
    assert AcceptanceStudy.summary_tables(resumed) == AcceptanceStudy.summary_tables(whole)
    assert report_tables(out) == report_tables(tmp_path / "whole")


def test_a_second_process_is_refused_while_a_run_holds_the_folder(tmp_path, driver):
    with ResultsStore(tmp_path, {"study": "x"}):
        status = driver.attempt(tmp_path, None)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 1
        assert f"in use by another run (lock {tmp_path / LOCK_FILE})" in driver.errors()
        assert sorted(path.name for path in tmp_path.iterdir()) == [LOCK_FILE, SETTINGS_FILE]
