"""The bias study: exact per-token bias and rejection of Decoding-OPT and Decoding-UNO along
real generations, and their measured speed."""

import pytest

from specbound.studies.bias import REFERENCE, BiasStudy, bias_summary
from specbound.studies.runner import run_study
from specbound.models.tiny import tiny_pair, tiny_prompts

EPSILONS = (0.1, 0.4)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    study = BiasStudy(epsilons=EPSILONS, gamma=3, max_new_tokens=8)
    return run_study(study, tiny_pair(), tiny_prompts(3), tmp_path_factory.mktemp("bias"), "toy", progress=False)


def test_decoding_opt_is_on_the_front_and_uno_above_it_at_every_position(results):
    """[YIN] Thm 5: OPT's bias + rejection = TV(p, q); Thm 4: no resampling law does better
    with the same acceptance, so UNO's bias is at least OPT's (same ε, same rejection)."""
    assert results.positions
    for record in results.positions:
        points = {(point["method"], point["epsilon"]): point for point in record["points"]}
        for epsilon in EPSILONS:
            opt, uno = points[("decoding_opt", epsilon)], points[("decoding_uno", epsilon)]
            assert opt["bias"] + opt["rejection"] == pytest.approx(record["total_variation"], abs=1e-12)
            assert uno["rejection"] == pytest.approx(opt["rejection"], abs=1e-15)
            assert uno["bias"] >= opt["bias"] - 1e-12


def test_only_the_lossless_reference_is_scored_and_every_configuration_is_run(results):
    configs = {run["config"] for run in results.runs}
    assert configs == {REFERENCE} | {f"{m},ε={e:g}" for m in ("decoding_opt", "decoding_uno") for e in EPSILONS}
    assert {record["config"] for record in results.positions} == {REFERENCE}


def test_summary_puts_the_points_against_the_mean_total_variation(results):
    summary = bias_summary(results)
    front = summary["front"][0.7][0]
    for epsilon in EPSILONS:
        point = summary["points"][(0.7, "decoding_opt", epsilon)]
        assert point["bias"][0] + point["rejection"][0] == pytest.approx(front, abs=1e-12)
    reference = summary["measured"][(0.7, REFERENCE)]
    assert reference["gain_per_call"] == 1.0
    assert summary["measured"][(0.7, "decoding_opt,ε=0.4")]["tokens_per_call"] >= 1.0


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="methods"):
        BiasStudy(methods=["decoding_magic"])
    with pytest.raises(ValueError, match="epsilon"):
        BiasStudy(epsilons=[-0.1])
