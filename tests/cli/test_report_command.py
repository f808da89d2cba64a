"""``specbound report`` on results it cannot read: one clear line naming the folder, never a
traceback."""

import json
import shutil

import pytest
import torch

from specbound.cli import main
from specbound.studies.acceptance import AcceptanceStudy
from specbound.studies.runner import run_study
from studies.study_fixtures import tiny_pair, tiny_prompts


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
    assert str(copy) in message and "records of the bias study" in message


def test_records_without_a_kind_are_refused_saying_so(acceptance_results, tmp_path, capsys):
    copy = copy_of(acceptance_results, tmp_path)
    records = [json.loads(line) for line in (copy / "records.jsonl").read_text().splitlines()]
    (copy / "records.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "kind"}) + "\n"
                                                for r in records))
    assert main(["report", str(tmp_path / "results")]) == 2
    message = capsys.readouterr().err.strip()
    assert str(copy) in message and 'no run record (a line with "kind": "run")' in message
