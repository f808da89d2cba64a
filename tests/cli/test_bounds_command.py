"""``specbound bounds``: every row of a batch, a long certificate shown in part, and work
beyond the limits refused before it starts."""

import json

import numpy as np
import pytest

from specbound.cli import main

FIXTURE_A = ["--target", "0.4,0.3,0.2,0.1", "--draft", "0.1,0.2,0.3,0.4"]


@pytest.fixture
def batch(tmp_path):
    path = tmp_path / "batch.json"
    path.write_text(json.dumps({"target": [[0.5, 0.5], [0.2, 0.8]], "draft": [[0.5, 0.5], [0.3, 0.7]]}))
    return str(path)


def test_optimum_reports_every_row_of_a_batch(batch, capsys):
    assert main(["bounds", "optimum", "--target", batch, "-n", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    alphas = [{r["scheme"]: r["acceptance"] for r in row["schemes"]}["with_replacement"] for row in rows]
    assert alphas == pytest.approx([1.0, 0.9], abs=1e-12)


def test_plot_refuses_a_batch_with_a_clear_error(batch, tmp_path, capsys):
    assert main(["bounds", "plot", "--target", batch, "--out", str(tmp_path / "plot")]) == 2
    assert "bounds plot draws one (target, draft) pair, got a batch of 2 rows" in capsys.readouterr().err


def test_a_long_certificate_is_shown_in_part_and_kept_whole_in_json(capsys):
    """At V = 200k the table printed a 4 MB column of token ids."""
    rng = np.random.default_rng(0)
    target, draft = (",".join(map(repr, rng.dirichlet(np.ones(400)).tolist())) for _ in range(2))
    assert main(["bounds", "optimum", "--target", target, "--draft", draft]) == 0
    table = capsys.readouterr().out
    assert "more; --json has all)" in table and max(map(len, table.splitlines())) < 300
    assert main(["bounds", "optimum", "--target", target, "--draft", draft, "--json"]) == 0
    subset = json.loads(capsys.readouterr().out)["schemes"][0]["subset"]
    assert len(subset) > 100


def test_plot_to_eight_drafts_finishes_with_the_lp_refused_where_it_would_not(tmp_path, capsys):
    """``bounds plot --max-drafts 8`` used to run the optimal verifier's LP at n = 7 and 8
    (fixture A) for minutes; the LP's time estimate refuses it there."""
    assert main(["bounds", "plot", *FIXTURE_A, "--max-drafts", "8", "--out", str(tmp_path), "--json"]) == 0
    optimal = json.loads(capsys.readouterr().out)["verifiers"]["optimal"]["acceptance"]
    assert all(value is not None for value in optimal[:6]) and optimal[6:] == [None, None]


@pytest.mark.parametrize("max_drafts", [10**9, 10**20])
def test_plot_refuses_unbounded_drafts_with_the_estimate(max_drafts, tmp_path, capsys):
    assert main(["bounds", "plot", *FIXTURE_A, "--max-drafts", str(max_drafts), "--out", str(tmp_path)]) == 2
    assert "max_drafts" in capsys.readouterr().err


def test_an_out_folder_that_is_a_file_is_refused_naming_the_option(tmp_path, capsys):
    blocking = tmp_path / "a-file"
    blocking.write_text("")
    with pytest.raises(SystemExit) as exit_info:
        main(["bounds", "plot", "--out", str(blocking)])
    assert exit_info.value.code == 2
    assert "argument --out" in capsys.readouterr().err


def test_optimum_refuses_zero_drafts_naming_the_option(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bounds", "optimum", "-n", "0"])
    assert exit_info.value.code == 2
    assert "argument -n/--num-drafts" in capsys.readouterr().err
