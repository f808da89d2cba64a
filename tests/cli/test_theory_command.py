"""``specbound theory``: every subcommand writes a PNG and a JSON whose numbers are the
library's, prints a table or JSON, and refuses bad settings with a ValueError."""

import json
import math

import numpy as np
import pytest

from specbound import cli
from specbound.chains.theory import batch_expected_rejections, random_chain_pair
from specbound.verifiers.biased import SWEEP_METHODS

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run_theory(*arguments) -> int:
    """Parse and run ``specbound theory ...`` (an error in the handler raises, as ``main`` would not)."""
    args = cli.build_parser().parse_args(["theory", *arguments])
    return args.handler(args)


def saved(out, name):
    assert (out / f"{name}.png").read_bytes()[:8] == PNG_SIGNATURE
    return json.loads((out / f"{name}.json").read_text())


def test_theory_is_registered_in_the_cli():
    assert "specbound.cli.theory" in cli.COMMAND_MODULES


def test_convergence_reports_thm1_and_the_acceleration(tmp_path, capsys):
    small = ["--horizon", "12", "--vocab", "4", "--seed", "10", "--runs", "300"]
    assert run_theory("convergence", *small, "--lookaheads", "2", "--out", str(tmp_path)) == 0
    table = capsys.readouterr().out
    numbers = saved(tmp_path, "convergence")
    chain = random_chain_pair(12, 4, np.random.default_rng(10))
    exact = batch_expected_rejections(chain, 1)
    assert numbers["exact_rejections"] == pytest.approx(exact.rejections, abs=1e-12)
    assert numbers["acceleration"] == pytest.approx(12 / exact.rejections, abs=1e-12)
    mean, error = numbers["mc_rejections"]
    assert abs(mean - exact.rejections) <= 4 * error
    assert [row["runs"] for row in numbers["convergence"]] == [10, 30, 100, 300]
    assert numbers["finite_lookahead"][0]["lookahead"] == 2
    assert "acceleration T / E[N_rej]" in table and f"{exact.acceleration:.6f}" in table


def test_drafts_curve_reaches_the_positive_limit(tmp_path, capsys):
    small = ["--horizon", "10", "--vocab", "3", "--runs", "200", "--max-drafts", "50"]
    assert run_theory("drafts", *small, "--simulated-drafts", "1,3", "--out", str(tmp_path),
                      "--json") == 0
    printed = json.loads(capsys.readouterr().out)
    numbers = saved(tmp_path, "drafts")
    assert printed == numbers
    chain = random_chain_pair(10, 3, np.random.default_rng(10))
    limit = batch_expected_rejections(chain, math.inf).rejections
    assert numbers["limit"]["exact_rejections"] == pytest.approx(limit, abs=1e-12)
    curve = [point["exact_rejections"] for point in numbers["curve"]]
    assert curve[0] > curve[-1] > limit > 0
    assert [row["num_drafts"] for row in numbers["monte_carlo"]] == [1, 3]


def test_improvement_closed_forms_match_the_general_formula(tmp_path, capsys):
    assert run_theory("improvement", "--max-drafts", "6", "--out", str(tmp_path)) == 0
    assert "batch improvement" in capsys.readouterr().out
    numbers = saved(tmp_path, "improvement")
    for curves in (numbers["bernoulli"], numbers["uniform"]):
        for closed, general, _ in curves.values():
            np.testing.assert_allclose(closed, general, atol=1e-12)
    closed, _, limit = numbers["bernoulli"]["u = 0.9, v = 0.5"]
    assert closed[1] == pytest.approx(0.4 * (1 - 0.9), abs=1e-12) and limit == pytest.approx(0.4)


def test_pareto_sweeps_put_opt_on_the_front(tmp_path, capsys):
    assert run_theory("pareto", "--epsilons", "0,0.1,0.2,0.4", "--out", str(tmp_path)) == 0
    assert "Loss*(b)" in capsys.readouterr().out
    numbers = saved(tmp_path, "pareto")
    assert numbers["total_variation"] == pytest.approx(0.4, abs=1e-12)
    for point in numbers["sweeps"]:
        on_front = point["rejection"] + point["least_bias"]
        assert on_front == pytest.approx(0.4, abs=1e-12)
        if point["method"] == "decoding_opt":
            assert point["bias"] == pytest.approx(point["least_bias"], abs=1e-12)
    assert {point["method"] for point in numbers["sweeps"]} == set(SWEEP_METHODS)


@pytest.mark.parametrize(
    ("arguments", "option"),
    [
        (["convergence", "--horizon", "0"], "--horizon"),
        (["convergence", "--horizon", "5", "--runs", "0"], "--runs"),
        (["convergence", "--vocab", "1"], "--vocab"),
        (["drafts", "--horizon", "5", "--simulated-drafts", "0"], "--simulated-drafts"),
        (["improvement", "--max-drafts", "0"], "--max-drafts"),
        (["improvement", "--bernoulli", "0.5:nan"], "--bernoulli"),
        (["pareto", "--random-points", "-1"], "--random-points"),
        (["pareto", "--seed", "-1"], "--seed"),
    ],
)
def test_bad_values_are_refused_by_the_parser_naming_the_option(arguments, option, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_theory(*arguments, "--out", str(tmp_path))
    assert exit_info.value.code == 2
    assert f"argument {option}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["pareto", "--target", "0.5,0.6", "--draft", "0.5,0.5"], "target_probs"),
        (["pareto", "--target", "0.5,0.5", "--draft", "0.2,0.3,0.5"], "draft_probs"),
        (["improvement", "--uniform", "3:4"], "uniform"),
    ],
)
def test_bad_settings_are_refused_with_a_value_error(arguments, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        run_theory(*arguments, "--out", str(tmp_path))


def test_an_unknown_sweep_method_is_refused_naming_the_option(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_theory("pareto", "--methods", "decoding_best", "--out", str(tmp_path))
    assert exit_info.value.code == 2
    assert "--methods" in capsys.readouterr().err


def test_a_lookahead_beyond_the_horizon_is_the_horizon(tmp_path, capsys):
    """γ = 10⁹ at T = 5 used to allocate a [V, γ + 1] array (52 GiB); no round drafts past
    the horizon, so it is γ = T, exactly."""
    small = ["--horizon", "5", "--vocab", "3", "--runs", "50"]
    assert run_theory("convergence", *small, "--lookaheads", "1000000000,5", "--out", str(tmp_path), "--json") == 0
    beyond, at = json.loads(capsys.readouterr().out)["finite_lookahead"]
    assert beyond["lookahead"] == 10**9
    for key in ("exact_rejections", "exact_target_calls", "tokens_per_call"):
        assert beyond[key] == at[key]


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        (["drafts", "--max-drafts", "1000000000"], "max_drafts"),
        (["drafts", "--max-drafts", str(10**20)], "max_drafts"),
        (["drafts", "--simulated-drafts", "100000"], "simulated_drafts"),
        (["convergence", "--runs", "1000000000"], "runs"),
        (["convergence", "--vocab", "100000"], "vocab_size"),
        (["improvement", "--max-drafts", "100000"], "max_drafts"),
        (["improvement", "--uniform", "100000000:1"], "uniform V = 100,000,000"),
        (["pareto", "--random-points", "100000000"], "random_points"),
    ],
)
def test_work_beyond_the_limits_is_refused_before_it_starts(arguments, named, tmp_path, capsys):
    """Each of these used to run for minutes or hours, or to run out of memory."""
    assert cli.main(["theory", *arguments, "--out", str(tmp_path)]) == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert named in message and "this needs about" in message and "above the limit of" in message


def test_a_concentration_that_makes_the_chains_equal_is_refused(tmp_path, capsys):
    """At 1e300 every row is uniform to rounding, E[N_rej] = 0 and the figure divided by it."""
    with pytest.raises(SystemExit) as exit_info:
        run_theory("convergence", "--concentration", "1e300", "--out", str(tmp_path))
    assert exit_info.value.code == 2
    assert "argument --concentration" in capsys.readouterr().err


def test_the_memory_limit_is_read_from_the_environment(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECBOUND_WORK_LIMIT_BYTES", "1000")
    assert cli.main(["theory", "convergence", "--horizon", "5", "--vocab", "3", "--runs", "20",
                     "--out", str(tmp_path)]) == 2
    message = capsys.readouterr().err
    assert "above the limit of 1,000 bytes" in message and "SPECBOUND_WORK_LIMIT_BYTES" in message
