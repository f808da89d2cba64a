"""Results are append-only and resumable: an interrupted study, resumed, writes exactly the
records of an uninterrupted one, byte for byte."""

import json

import pytest

from specbound.studies.acceptance import AcceptanceStudy
from specbound.studies.records import RECORDS_FILE, ResultsStore, read_results, unit_seed
from specbound.studies.runner import run_study
from study_fixtures import tiny_pair, tiny_prompts

PROMPTS = 4


class Interrupted(Exception):
    pass


class InterruptedStudy(AcceptanceStudy):
    """Stops (as Ctrl-C would) when it reaches unit number ``stop_at``."""

    def __init__(self, stop_at, **options):
        super().__init__(**options)
        self.stop_at, self.started = stop_at, 0

    def run_unit(self, pair, unit, generator):
        self.started += 1
        if self.started == self.stop_at:
            raise Interrupted
        return super().run_unit(pair, unit, generator)


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


def test_a_unit_is_written_once(tmp_path):
    store = ResultsStore(tmp_path, {"study": "x"})
    store.append_unit("a", [{"position": 0}], {"tokens": [1]}, {"total": 0.1})
    with pytest.raises(ValueError, match="unit"):
        store.append_unit("a", [], {}, {})


def test_unit_seeds_depend_on_seed_and_unit_only():
    assert unit_seed(0, "toy/1|T=0.7") == unit_seed(0, "toy/1|T=0.7")
    assert len({unit_seed(0, "a"), unit_seed(1, "a"), unit_seed(0, "b")}) == 3
    assert 0 <= unit_seed(5, "a") < 2**63


def test_reading_a_folder_without_settings_fails(tmp_path):
    with pytest.raises(ValueError, match="settings.json"):
        read_results(tmp_path)
