"""``specbound report`` on results it cannot read: one clear line naming the folder, never a
traceback."""

import json
import shutil

import pytest
import torch

from specbound.cli import main
from specbound.studies.acceptance import AcceptanceStudy
from specbound.studies.runner import run_study
from specbound.models.tiny import tiny_pair, tiny_prompts


@pytest.fixture(scope="module")
def acceptance_results(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("acceptance")
    run_study(AcceptanceStudy(temperatures=(0.7,), num_drafts=(2,), max_new_tokens=3), tiny_pair(), tiny_prompts(2),
              root / "acceptance" / "toy", "toy", progress=False)
    torch.set_num_threads(threads)
    return root / "acceptance" / "toy"


def copy_of(results, tmp_path):
    copy = tmp_path / "results" / "toy"
    shutil.copytree(results, copy)
    return copy


def test_records_of_another_study_type_are_refused_naming_the_folder(acceptance_results, tmp_path, capsys):
    """Acceptance records under settings that say "bias" ended in a KeyError traceback."""
    copy = copy_of(acceptance_results, tmp_path)
    settings = json.loads((copy / "settings.json").read_text())
    (copy / "settings.json").write_text(json.dumps({**settings, "study": "bias"}))
    assert main(["report", str(tmp_path / "results")]) == 2
    message = capsys.readouterr().err.strip()
    assert "Traceback" not in message and message.count("\n") == 0
    assert f"{copy / 'settings.json'}: no 'epsilons'" in message and "settings of every bias study" in message


def test_records_without_a_kind_are_refused_saying_so(acceptance_results, tmp_path, capsys):
    copy = copy_of(acceptance_results, tmp_path)
    records = [json.loads(line) for line in (copy / "records.jsonl").read_text().splitlines()]
    (copy / "records.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "kind"}) + "\n"
                                                for r in records))
    assert main(["report", str(tmp_path / "results")]) == 2
    message = capsys.readouterr().err.strip()
    assert f"{copy / 'records.jsonl'} line 1" in message and '"kind" is null, not "position" or "run"' in message


def rewritten(copy, edit, name="records.jsonl"):
    """Rewrite ``copy``/``name`` with ``edit`` applied to its parsed lines."""
    path = copy / name
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(line) + "\n" for line in edit(lines)))
    return path


def refusal(tmp_path, capsys) -> str:
    assert main(["report", str(tmp_path / "results")]) == 2
    message = capsys.readouterr().err.strip()
    assert "Traceback" not in message and "internal error" not in message and message.count("\n") == 0
    return message


def test_a_copied_position_line_is_refused_with_its_line_not_counted(acceptance_results, tmp_path, capsys):
    """A position line written twice (4 positions for a 3-token unit) was counted, moving the means."""
    copy = copy_of(acceptance_results, tmp_path)
    path = rewritten(copy, lambda lines: lines[:2] + lines[1:])
    message = refusal(tmp_path, capsys)
    assert f"{path} line 3" in message and "second position record" in message and "line 2" in message


def field_set(index, field, value):
    def edit(lines):
        lines[index][field] = value
        return lines
    return edit


def first_run(lines):
    return next(index for index, line in enumerate(lines) if line.get("kind") == "run")


@pytest.mark.parametrize("field, value, kind", [
    ("position", "0", "not an integer"), ("acceptance", [0.5], "not an object of numbers"),
    ("acceptance", {"single": "x"}, "not an object of numbers"), ("unit", 5, "not a string"),
    ("kind", "positions", '"kind" is "positions"'), ("tail_mass", 3, "not a list of numbers"),
])
def test_a_position_field_of_the_wrong_type_is_refused_with_its_line(acceptance_results, tmp_path, capsys, field,
                                                                     value, kind):
    """Such lines were read as they came: some reports ran on, others ended in an internal error."""
    copy = copy_of(acceptance_results, tmp_path)
    path = rewritten(copy, field_set(1, field, value))
    message = refusal(tmp_path, capsys)
    assert f"{path} line 2" in message and kind in message


@pytest.mark.parametrize("field, value", [("tokens", "abc"), ("engine", 3), ("temperature", "hot")])
def test_a_run_field_of_the_wrong_type_is_refused_with_its_line(acceptance_results, tmp_path, capsys, field, value):
    copy = copy_of(acceptance_results, tmp_path)
    lines = [json.loads(line) for line in (copy / "records.jsonl").read_text().splitlines()]
    path = rewritten(copy, field_set(first_run(lines), field, value))
    assert f"{path} line {first_run(lines) + 1}" in refusal(tmp_path, capsys)


def test_a_run_record_written_twice_is_refused(acceptance_results, tmp_path, capsys):
    copy = copy_of(acceptance_results, tmp_path)
    lines = [json.loads(line) for line in (copy / "records.jsonl").read_text().splitlines()]
    run = first_run(lines)
    path = rewritten(copy, lambda lines: lines[:run + 1] + [lines[run]] + lines[run + 1:])
    message = refusal(tmp_path, capsys)
    assert f"{path} line {run + 2}" in message and f"after its run record (line {run + 1})" in message


def test_a_timing_without_its_seconds_is_refused_with_its_line(acceptance_results, tmp_path, capsys):
    copy = copy_of(acceptance_results, tmp_path)
    path = rewritten(copy, field_set(0, "seconds", [1.0]), name="timings.jsonl")
    message = refusal(tmp_path, capsys)
    assert f"{path} line 1" in message and "not an object of numbers" in message


@pytest.mark.parametrize("blocking", ["report", "report/figures", "report/report.md"])
def test_a_file_or_folder_where_the_report_writes_is_refused_naming_it(acceptance_results, tmp_path, capsys,
                                                                       blocking):
    """``report DIR`` where DIR/report is a file ended in an internal error."""
    copy_of(acceptance_results, tmp_path)
    path = tmp_path / "results" / blocking
    path.parent.mkdir(parents=True, exist_ok=True)
    if blocking.endswith(".md"):
        path.mkdir()
    else:
        path.write_text("not a folder")
    message = refusal(tmp_path, capsys)
    assert str(path) in message and "move it away" in message


@pytest.mark.parametrize("field, value, kind", [
    ("models", 5, "not an object"), ("temperatures", "x", "not a list of numbers"), ("seed", "0", "not an integer"),
    ("num_drafts", ["2"], "not a list of integers"),
])
def test_a_setting_of_the_wrong_type_is_refused_naming_the_file(acceptance_results, tmp_path, capsys, field, value,
                                                                 kind):
    """models = 5 ended in an internal error (AttributeError), temperatures = "x" in a TypeError."""
    copy = copy_of(acceptance_results, tmp_path)
    settings = json.loads((copy / "settings.json").read_text())
    (copy / "settings.json").write_text(json.dumps({**settings, field: value}))
    message = refusal(tmp_path, capsys)
    assert f"{copy / 'settings.json'}: {field!r} is" in message and kind in message
