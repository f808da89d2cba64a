"""The rejections study: the engine's measured rejections against Yin's theory along the
same traces.

``trace_expected_cost`` is checked exactly against ``chain_theory`` elsewhere
(test_study_trace_theory); here it must agree with the engine: for each run, measured −
predicted has mean zero, so over RUNS independent runs the mean difference must lie within
4 standard errors (the standard error estimated from the runs).
"""

import math

import numpy as np
import pytest
import torch

from specbound.engine import Processing
from specbound.studies.rejections import DecodingConfig, RejectionsStudy, decoding_configs, rejections_summary
from specbound.studies.runner import run_study
from specbound.studies.trace_theory import trace_expected_cost
from specbound.studies.traces import generate_trace, trace_probs
from specbound.models.tiny import tiny_pair, tiny_prompts

HORIZON = 8



def paired_z(config: DecodingConfig, runs: int, processing=Processing(temperature=1.0)) -> dict:
    pair, prompts = tiny_pair(), tiny_prompts(6)
    generator = torch.Generator().manual_seed(11)
    differences = {"rejections": [], "target_calls": []}
    for run in range(runs):
        prompt_ids = pair.encode(prompts[run % len(prompts)].text)
        trace = generate_trace(pair, processing, config.method(HORIZON), prompt_ids, HORIZON, generator,
                               stop_at_eos=False)
        predicted = trace_expected_cost(*trace_probs(pair, trace, processing), np.array(trace.tokens),
                                        config.num_drafts, config.lookahead)
        differences["rejections"].append(trace.stats.rejections - predicted.rejections)
        differences["target_calls"].append(trace.stats.target_calls - predicted.target_calls)
    return {key: np.mean(values) / (np.std(values, ddof=1) / math.sqrt(runs)) for key, values in differences.items()}


def test_engine_rejections_match_the_trace_prediction_within_4_sigma():
    """Batch SD, M = 2 drafts, K = ∞ (the depth cut at the horizon included)."""
    z = paired_z(DecodingConfig(2, None), runs=80)
    assert abs(z["rejections"]) < 4 and abs(z["target_calls"]) < 4, z


@pytest.mark.slow
@pytest.mark.parametrize("config", [DecodingConfig(1, None), DecodingConfig(1, 2), DecodingConfig(3, 3),
                                    DecodingConfig(4, None)], ids=lambda config: config.label)
def test_more_configurations_match_the_trace_prediction_within_4_sigma(config):
    z = paired_z(config, runs=400, processing=Processing(temperature=0.8, top_p=0.9))
    assert abs(z["rejections"]) < 4 and abs(z["target_calls"]) < 4, z


def test_configurations_list_chains_then_batch_sizes_without_repeats():
    configs = decoding_configs([None, 4], [1, 2], None)
    assert [config.label for config in configs] == ["M=1,γ=∞", "M=1,γ=4", "M=2,γ=∞"]
    with pytest.raises(ValueError, match="lookahead"):
        RejectionsStudy(lookaheads=[0])
    with pytest.raises(ValueError, match="batch_sizes"):
        RejectionsStudy(batch_sizes=[0])
    with pytest.raises(ValueError, match="batch_sizes.*4,096 drafted tokens"):  # refused before any model loads
        RejectionsStudy(batch_sizes=[10**9])
    assert RejectionsStudy(max_new_tokens=6, lookaheads=[10**9]).configs[0].method(6).depth == 6  # γ > horizon: K = ∞
    with pytest.raises(ValueError, match="max_new_tokens.*4,096 drafted tokens"):  # K = ∞ drafts the whole horizon
        RejectionsStudy(max_new_tokens=10**9, lookaheads=[None])


def test_the_study_records_measured_and_predicted_counts(tmp_path):
    study = RejectionsStudy(max_new_tokens=6, lookaheads=[None, 2], batch_sizes=[2])
    results = run_study(study, tiny_pair(), tiny_prompts(3), tmp_path, "toy", progress=False)
    assert len(results.runs) == 9
    for run in results.runs:
        assert run["horizon"] == 6 == len(run["tokens"])  # a fixed horizon: EOS does not stop
        positions = [r for r in results.positions if r["unit"] == run["unit"]]
        assert sum(r["expected_rejection"] for r in positions) == pytest.approx(run["predicted"]["rejections"])
        assert sum(r["total_variation"] for r in positions) == pytest.approx(run["sum_total_variation"])
        if run["num_drafts"] == 1:  # Thm 1 along the trace is Σ_t TV(p_t, q_t)
            assert run["theorem_rejections"] == pytest.approx(run["sum_total_variation"])
    summary = rejections_summary(results)
    assert [row["config"] for row in summary] == ["M=1,γ=∞", "M=1,γ=2", "M=2,γ=∞"]
    assert all(row["prompts"] == 3 and row["horizon"] == 6 for row in summary)
