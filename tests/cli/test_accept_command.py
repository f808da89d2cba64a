"""``specbound accept``: the table and JSON carry the exact SPEC §4.4 numbers."""

import json

import pytest

from specbound.cli import main


def run_json(capsys, *args):
    assert main(["accept", *args, "--json"]) == 0
    return {record["method"]: record for record in json.loads(capsys.readouterr().out)["methods"]}


def test_accept_prints_fixture_a(capsys):
    records = run_json(capsys, "--target", "0.4,0.3,0.2,0.1", "--draft", "0.1,0.2,0.3,0.4", "-n", "2")
    assert records["single"]["acceptance"] == pytest.approx(0.6, abs=1e-9)
    assert records["rrs"]["acceptance"] == pytest.approx(0.72, abs=1e-9)
    assert records["rrs_without_replacement"]["acceptance"] == pytest.approx(0.764286, abs=1e-6)
    assert records["kseq"]["acceptance"] == pytest.approx(0.75, abs=1e-9)
    assert records["spechub"]["acceptance"] == pytest.approx(0.766667, abs=1e-6)
    assert records["greedy"]["acceptance"] == pytest.approx(0.766667, abs=1e-6)
    assert records["optimal α* (with_replacement)"]["acceptance"] == pytest.approx(0.79, abs=1e-9)
    assert records["optimal α* (without_replacement)"]["acceptance"] == pytest.approx(0.834524, abs=1e-6)
    assert records["rrs"]["gap"] == pytest.approx(0.79 - 0.72, abs=1e-9)


def test_accept_reads_a_json_file_and_prints_a_table(tmp_path, capsys):
    pair = tmp_path / "pair.json"
    pair.write_text(json.dumps({"target": [0.5, 0.25, 0.15, 0.07, 0.03], "draft": [0.3, 0.3, 0.2, 0.1, 0.1]}))
    assert main(["accept", "--target", str(pair), "-n", "3"]) == 0
    out = capsys.readouterr().out
    assert "kseq" in out and "0.950542" in out and "0.902000" in out
    # SpecHub is a two-draft method: its verifier is shown at n = 2, its α* at n = 3 said not to apply
    assert "optimal α* (spechub): not applicable" in out and "n = 2 only" in out
    spechub_row = next(line for line in out.splitlines() if line.startswith("spechub "))
    assert spechub_row.split()[2:4] == ["2", "1.000000"]


def test_accept_reports_bad_input(capsys):
    assert main(["accept", "--target", "0.5,0.6", "--draft", "0.5,0.5"]) == 2
    assert "target_probs: rows must sum to 1" in capsys.readouterr().err
    assert main(["accept", "--target", "0.5,x", "--draft", "0.5,0.5"]) == 2
    assert "comma-separated" in capsys.readouterr().err
