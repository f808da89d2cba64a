"""``specbound accept``: the table and JSON carry the exact SPEC §4.4 numbers."""

import json

import numpy as np
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


def test_accept_reports_every_row_of_a_batch(tmp_path, capsys):
    """A JSON file of two rows gets two rows of numbers (the first row alone used to be
    reported, silently: single = 1.0, row 2's 0.9 dropped)."""
    batch = tmp_path / "batch.json"
    batch.write_text(json.dumps({"target": [[0.5, 0.5], [0.2, 0.8]], "draft": [[0.5, 0.5], [0.3, 0.7]]}))
    assert main(["accept", "--target", str(batch), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [row["target"] for row in rows] == [[0.5, 0.5], [0.2, 0.8]]
    single = [{r["method"]: r for r in row["methods"]}["single"]["acceptance"] for row in rows]
    assert single == pytest.approx([1.0, 0.9], abs=1e-12)
    assert main(["accept", "--target", str(batch)]) == 0
    table = capsys.readouterr().out
    assert "row 0" in table and "row 1" in table and "0.900000" in table


def test_a_json_value_that_is_not_a_list_is_refused_naming_the_file(tmp_path, capsys):
    pair = tmp_path / "pair.json"
    pair.write_text(json.dumps({"target": {"a": 1}, "draft": [0.5, 0.5]}))
    assert main(["accept", "--target", str(pair)]) == 2
    message = capsys.readouterr().err.strip()
    assert message.count("\n") == 0 and "target_probs" in message and str(pair) in message


@pytest.mark.parametrize("count", ["0", "-1"])
def test_accept_refuses_a_count_below_one_naming_the_option(count, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["accept", "--target", "0.5,0.5", "-n", count])
    assert exit_info.value.code == 2
    assert "argument -n/--num-drafts" in capsys.readouterr().err


def test_accept_refuses_unbounded_drafts_with_the_estimate_and_the_limit(capsys):
    """n = 10²⁰ used to loop for ever in the n-step products."""
    assert main(["accept", "--target", "0.4,0.3,0.2,0.1", "--draft", "0.1,0.2,0.3,0.4", "-n", str(10**20)]) == 2
    message = capsys.readouterr().err
    assert "num_drafts" in message and "this needs about" in message and "above the limit of 30 s" in message


def test_the_lp_verifier_beyond_its_time_limit_is_not_applicable(capsys):
    """Fixture A at n = 8: 65,536 × 4 variables are within MAX_LP_VARIABLES but take HiGHS
    minutes; the LP is refused by its time estimate and the rest of the table is printed."""
    assert main(["accept", "--target", "0.4,0.3,0.2,0.1", "--draft", "0.1,0.2,0.3,0.4", "-n", "8"]) == 0
    out = capsys.readouterr().out
    assert "optimal: not applicable — draft_tuples: the coupling LP" in out and "above the limit of 10 s" in out


def test_the_lp_verifier_beyond_its_size_limit_says_what_limit_and_what_fits(capsys):
    """A 1,000-token pair at n = 2 used to say "enumerating 1000^2 draft tuples exceeds 1,000"
    (the tuples allowed for this V, a number no option sets); now the LP's own limit, stated
    as ``generate`` states it before a model loads, and what would fit."""
    uniform = ",".join(["0.001"] * 1000)
    assert main(["accept", "--target", uniform, "--draft", uniform, "-n", "2"]) == 0
    note = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("optimal: "))
    assert "linear program over every tuple of n = 2 drafts and every token of the vocabulary" in note
    assert "(tuples × V variables, at most 1,000,000)" in note and "exceeds" not in note
    assert "1,000^2 tuples" in note and "V = 1,000 tokens ≈ 1e9 variables" in note
    assert "use n ≤ 1, or at n = 2 a draft of at most 31 tokens of positive probability" in note


def test_a_bracket_midpoint_is_reported_with_its_bracket(monkeypatch, capsys):
    """Past the n = 3 work limit, RRS without replacement is the midpoint of a certified
    bracket, and the note says so (here the limit is made small for a 3,000-token row)."""
    from specbound.verifiers import rrs_exact

    rng = np.random.default_rng(3)
    target, draft = rng.dirichlet(np.ones(3000)), rng.dirichlet(np.ones(3000))
    exact = rrs_exact.rrs_without_replacement_acceptance(target, draft, 3)
    monkeypatch.setattr(rrs_exact, "BRACKET_SECONDS_LIMIT", 0.01)
    text = [",".join(map(repr, row.tolist())) for row in (target, draft)]
    assert main(["accept", "--target", text[0], "--draft", text[1], "-n", "3", "--json"]) == 0
    record = {r["method"]: r for r in json.loads(capsys.readouterr().out)["methods"]}["rrs_without_replacement"]
    low, high = map(float, record["note"].split("bracket [")[1].split("]")[0].split(", "))
    assert low <= exact <= high and 2e-10 < high - low < 1e-3
    assert record["acceptance"] == pytest.approx(0.5 * (low + high), abs=1e-12)


def test_running_out_of_memory_ends_with_status_2(monkeypatch, capsys):
    def exhausted(*args):
        raise MemoryError

    monkeypatch.setattr("specbound.tables.bounds.acceptance_table", exhausted)
    assert main(["accept", "--target", "0.5,0.5", "--draft", "0.5,0.5"]) == 2
    assert "error: out of memory" in capsys.readouterr().err


@pytest.mark.parametrize("target", ["0.5,0.5", "{list_file}"])
def test_a_target_without_a_draft_is_refused_unless_one_file_holds_both(target, tmp_path, capsys):
    """``accept --target 0.5,0.5`` used to take the target as the draft and print acceptance
    1.000000 everywhere; only a JSON object of {"target", "draft"} supplies both."""
    listed = tmp_path / "row.json"
    listed.write_text(json.dumps([0.5, 0.5]))
    assert main(["accept", "--target", target.format(list_file=listed)]) == 2
    message = capsys.readouterr().err.strip()
    assert message.count("\n") == 0 and "draft_probs: --draft is required" in message


def test_the_work_limit_is_read_from_the_environment(monkeypatch, capsys):
    """The 30 s limit is a constant against estimates from costs measured once; the
    environment variable the refusal names sets it (here far down, to see it refuse)."""
    pair = ["--target", "0.4,0.3,0.2,0.1", "--draft", "0.1,0.2,0.3,0.4", "-n", str(10**20)]
    assert main(["accept", *pair]) == 2
    assert "raise the limit with SPECBOUND_WORK_LIMIT_SECONDS" in capsys.readouterr().err
    monkeypatch.setenv("SPECBOUND_WORK_LIMIT_SECONDS", "1e-9")
    assert main(["accept", *pair[:4], "-n", "2"]) == 2
    assert "above the limit of 1e-09 s" in capsys.readouterr().err
    monkeypatch.setenv("SPECBOUND_WORK_LIMIT_SECONDS", "fast")
    assert main(["accept", *pair[:4], "-n", "2"]) == 2
    assert "SPECBOUND_WORK_LIMIT_SECONDS: expected a positive number" in capsys.readouterr().err
