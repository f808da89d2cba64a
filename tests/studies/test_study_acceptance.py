"""The acceptance study: exact per-position acceptance along real generations.

The key check ties the study to the engine: along the engine's own generations, at the
positions the engine verified, the study's exact acceptance α_t (computed from one batched
forward of each model over the generated text) must predict the engine's accept/reject
outcomes. Given everything before a verification, the engine accepts with probability
exactly α_t, so Σ (accepted − α_t) over all verifications is a martingale with variance
Σ α_t(1 − α_t): the test asserts |z| < 4 (two-sided level ≈ 6e-5). With about 500
verifications it sees a mean error in α of about 0.06 or more; its power is checked by
the same statistic against a wrong model of the engine, which it must reject.
"""

import math
from multiprocessing import shared_memory

import numpy as np
import pytest
import torch

from specbound.engine import Processing
from specbound.engine.methods import build_method
from specbound.studies.acceptance import (AcceptanceStudy, acceptance_methods, acceptance_summary, exact_acceptances,
                                         gap_summary, method_acceptance, unit_exact_part)
from specbound.studies.acceptance_methods import attained_optimum

METHODS = list(acceptance_methods())
from specbound.studies.runner import run_study
from specbound.studies.traces import generate_trace, next_token_probs, trace_probs
from specbound.verifiers import get_verifier
from specbound.models.tiny import tiny_pair, tiny_prompts

HORIZON = 8
RUNS = 100



def verified_positions(accepted_lengths, horizon):
    """(position, accepted) of each verification of a depth-1 tree run over a fixed horizon.

    Each engine step verifies the root position and, when a draft is accepted, adds a bonus
    token after it; the step at the horizon's last position has depth 0 (a bonus only)."""
    position, verified = 0, []
    for accepted in accepted_lengths:
        if position == horizon - 1:
            position += 1
            continue
        verified.append((position, bool(accepted)))
        position += 1 + accepted
    assert position == horizon
    return verified


def engine_z_scores(verifier, num_drafts, processing, alternative, runs=RUNS):
    """z of the engine's acceptances against the study's α_t, and against the acceptance
    ``alternative`` = (method, n) at the same positions (a wrong model of the engine)."""
    pair = tiny_pair()
    method = build_method("tree", num_drafts=num_drafts, depth=1, verifier=verifier)
    generator = torch.Generator().manual_seed(2024)
    prompts = tiny_prompts(6)
    totals = np.zeros((2, 3))  # [study, alternative] x [Σ accepted − α, Σ α(1 − α), count]
    for run in range(runs):
        prompt_ids = pair.encode(prompts[run % len(prompts)].text)
        trace = generate_trace(pair, processing, method, prompt_ids, HORIZON, generator, stop_at_eos=False)
        rows = trace_probs(pair, trace, processing)
        predictions = [method_acceptance(verifier, *rows, num_drafts), method_acceptance(alternative[0], *rows, alternative[1])]
        verified = verified_positions(trace.stats.accepted_lengths, HORIZON)
        assert len(verified) == sum(trace.stats.attempts_by_position)
        for total, exact in zip(totals, predictions):
            for position, accepted in verified:
                total += (accepted - exact[position], exact[position] * (1 - exact[position]), 1)
    return [total[0] / math.sqrt(total[1]) for total in totals], int(totals[0, 2])


def test_exact_acceptance_predicts_the_engines_acceptances_within_4_sigma():
    """RRS without replacement, n = 2. Power: the same check must reject the single-draft
    acceptance at the same positions (the second draft ignored, about 0.2 lower)."""
    (study, wrong), count = engine_z_scores("rrs_without_replacement", 2, Processing(temperature=0.8), ("single", 1))
    assert count > 400
    assert abs(study) < 4, f"z = {study:.2f} over {count} verifications"
    assert abs(wrong) > 4, f"the check cannot see the second draft (z = {wrong:.2f})"


@pytest.mark.slow
@pytest.mark.parametrize(
    "verifier, num_drafts, alternative",
    [("kseq", 3, ("single", 1)), ("rrs", 3, ("single", 1)), ("greedy", 3, ("rrs", 3)),
     ("spechub", 2, ("rrs", 2)), ("single", 1, ("rrs", 2))],
)
def test_more_verifiers_predict_the_engines_acceptances_within_4_sigma(verifier, num_drafts, alternative):
    processing = Processing(temperature=1.0, top_k=4)
    (study, wrong), count = engine_z_scores(verifier, num_drafts, processing, alternative, runs=300)
    assert abs(study) < 4, f"{verifier}: z = {study:.2f} over {count} verifications"
    assert abs(wrong) > 4, f"{verifier}: the check cannot see {alternative} (z = {wrong:.2f})"


def test_one_forward_gives_the_stepwise_next_token_laws():
    pair, processing = tiny_pair(), Processing(temperature=0.7)
    prompt, tokens = [1, 2, 3], [4, 0, 2, 5]
    rows = next_token_probs(pair.target, prompt, tokens, processing)
    for position in range(len(tokens)):
        with torch.no_grad():
            logits = pair.target(input_ids=torch.tensor([prompt + tokens[:position]])).logits[:, -1]
        np.testing.assert_allclose(rows[position], processing.probs(logits).numpy()[0], atol=1e-6)


def test_a_row_with_too_few_draft_tokens_gets_as_many_drafts_as_it_has(rng):
    """As the engine draws min(n, |supp q|) distinct drafts, the study evaluates such a row
    with that many; SpecHub with one draft is single-draft speculative sampling."""
    target = rng.dirichlet(np.ones(6), size=3)
    draft = rng.dirichlet(np.ones(6), size=3)
    draft[1, 2:] = 0.0  # two tokens only
    draft[1] /= draft[1].sum()
    draft[2, 1:] = 0.0  # one token only
    draft[2, 0] = 1.0
    for method, verifier in [("rrs_without_replacement", "rrs_without_replacement"), ("greedy", "greedy")]:
        values = method_acceptance(method, target, draft, 3)
        for row, count in [(0, 3), (1, 2), (2, 1)]:
            expected = get_verifier(verifier).acceptance_rate(target[row], draft[row], count)[0]
            assert values[row] == pytest.approx(expected, abs=1e-12)
    spechub = method_acceptance("spechub", target, draft, 3)
    assert spechub[2] == pytest.approx(get_verifier("single").acceptance_rate(target[2], draft[2], 1)[0])
    assert spechub[0] == pytest.approx(get_verifier("spechub").acceptance_rate(target[0], draft[0], 2)[0])


def test_verifiers_sit_at_or_below_their_optimum(rng):
    target = rng.dirichlet(np.full(7, 0.6), size=20)
    draft = rng.dirichlet(np.full(7, 0.6), size=20)
    for num_drafts in (2, 3):
        values = {method: method_acceptance(method, target, draft, num_drafts) for method in METHODS}
        for verifier in ("rrs", "kseq"):
            assert np.all(values[verifier] <= values["optimal_with_replacement"] + 1e-9)
        assert np.all(values["rrs_without_replacement"] <= values["optimal_without_replacement"] + 1e-9)
        np.testing.assert_allclose(values["greedy"], values["optimal_greedy"], atol=1e-9)
        assert np.all(values["single"] <= values["rrs"] + 1e-12)


def test_a_verifier_that_attains_its_optimum_is_recorded_with_the_optimums_values(rng):
    """Verifiers marked attains_optimum compute exactly their scheme's α* (the mark cannot
    lie), and the study's copy of the optimum's values equals computing them."""
    marked = [name for name, entry in acceptance_methods().items()
              if entry.verifier is not None and entry.verifier.attains_optimum]
    assert {"greedy", "spechub"} <= set(marked)
    pairs = [tuple(rng.dirichlet(np.full(9, 0.5), size=2)) for _ in range(6)]
    for num_drafts in (2, 3):
        alone, _ = exact_acceptances(marked, pairs, num_drafts)
        with_optima, _ = exact_acceptances(list(acceptance_methods()), pairs, num_drafts)
        for method in marked:
            assert alone[method] == with_optima[method]
            assert with_optima[method] == with_optima[attained_optimum(method, num_drafts)]


def test_unknown_methods_are_refused():
    with pytest.raises(ValueError, match="method"):
        method_acceptance("magic", np.ones((1, 2)) / 2, np.ones((1, 2)) / 2, 2)
    with pytest.raises(ValueError, match="methods"):
        AcceptanceStudy(methods=["magic"])
    with pytest.raises(ValueError, match="num_drafts"):
        AcceptanceStudy(num_drafts=[0])
    with pytest.raises(ValueError, match="temperature"):
        AcceptanceStudy(temperatures=[-1.0])
    with pytest.raises(ValueError, match="max_new_tokens"):
        AcceptanceStudy(max_new_tokens=0)


def test_the_study_records_every_method_at_every_position_and_n(tmp_path):
    study = AcceptanceStudy(temperatures=(0.7, 1.0), num_drafts=(2, 3), max_new_tokens=6)
    results = run_study(study, tiny_pair(), tiny_prompts(3), tmp_path, dataset="toy", progress=False)
    assert len(results.runs) == 6
    generated = {(run["prompt_id"], run["temperature"]): len(run["tokens"]) for run in results.runs}
    assert len(results.positions) == 2 * sum(generated.values())
    for record in results.positions:
        assert set(record["acceptance"]) == set(METHODS)
        assert all(0.0 <= value <= 1.0 + 1e-12 for value in record["acceptance"].values())
    summary = acceptance_summary(results)
    mean, error, count = summary[(0.7, 3, "optimal_without_replacement")]
    assert count == generated[("toy/0", 0.7)] + generated[("toy/1", 0.7)] + generated[("toy/2", 0.7)]
    assert summary[(0.7, 3, "rrs")][0] <= summary[(0.7, 3, "optimal_with_replacement")][0] + 1e-12
    assert error >= 0.0
    gaps = gap_summary(results)  # paired: the per-token mean of α*_t − α_t
    verified = ("rrs", "kseq", "rrs_without_replacement", "greedy", "spechub", "global_resolution")
    assert set(gaps) == {(t, n, m) for t in (0.7, 1.0) for n in (2, 3) for m in verified}
    for (temperature, num_drafts, method), (gap, gap_error, _) in gaps.items():
        optimum = summary[(temperature, num_drafts, f"optimal_{get_verifier(method).scheme}")][0]
        if method == "spechub":  # at its own count, n = 2, whatever n the study asks for
            optimum = summary[(temperature, 2, "optimal_spechub")][0]
        assert gap == pytest.approx(optimum - summary[(temperature, num_drafts, method)][0], abs=1e-12)
        assert gap >= -1e-12 and gap_error >= 0.0


def test_a_method_without_an_exact_value_for_some_prompt_is_left_out_not_averaged(tmp_path, monkeypatch):
    """When a method has no exact algorithm at some size (e.g. RRS without replacement at
    n ≥ 4 on a 150k vocabulary), its (temperature, n) cell is dropped for every prompt and
    the reason kept, instead of averaging over the prompts where it worked."""
    from specbound.studies import exact_part
    from specbound.studies.acceptance_report import unavailable_methods

    compute = exact_part.method_acceptance_of
    calls = {"kseq": 0}

    def flaky(method, rows, num_drafts):
        if method == "kseq" and num_drafts == 3:
            calls["kseq"] += 1
            if calls["kseq"] == 1:  # the first prompt only
                raise ValueError("num_drafts: too large here")
        return compute(method, rows, num_drafts)

    monkeypatch.setattr(exact_part, "method_acceptance_of", flaky)
    study = AcceptanceStudy(num_drafts=(2, 3), max_new_tokens=4, methods=("single", "kseq"))
    results = run_study(study, tiny_pair(), tiny_prompts(2), tmp_path, "toy", progress=False)
    summary = acceptance_summary(results)
    assert (0.7, 2, "kseq") in summary and (0.7, 3, "single") in summary
    assert (0.7, 3, "kseq") not in summary
    assert unavailable_methods(results) == {"kseq, n=3": "num_drafts: too large here"}


def test_scoring_runs_in_float32_and_leaves_the_model_in_its_own_dtype():
    """A bfloat16 model is scored by its exact float32 upcast, its logits rounded back to
    bfloat16 (the precision of its outputs), and left in bfloat16."""
    import copy

    model = copy.deepcopy(tiny_pair().target).to(torch.bfloat16)
    upcast = copy.deepcopy(model).float()  # the same weights, exactly, in float32
    processing, prompt, tokens = Processing(temperature=1.0), [1, 2], [3, 4, 5]
    rows = next_token_probs(model, prompt, tokens, processing)
    assert next(model.parameters()).dtype == torch.bfloat16
    with torch.no_grad():
        logits = upcast(input_ids=torch.tensor([prompt + tokens[:-1]])).logits[0, -len(tokens):]
    expected = processing.probs(logits.to(torch.bfloat16).float()).double()
    np.testing.assert_allclose(rows, (expected / expected.sum(dim=1, keepdim=True)).numpy(), atol=1e-12)
    np.testing.assert_allclose(rows.sum(axis=1), 1.0, atol=1e-12)


def test_cutting_the_tail_moves_every_method_by_at_most_its_bound(rng):
    """Rows with a long tail of tiny probabilities, cut with a budget of 1e-3 (far more
    than the studies' 1e-7): every method moves by at most the recorded bound B (proven
    for Σ min and α*, checked here for the verifiers), B stays within the budget, and a
    zero budget changes nothing."""
    from specbound.bounds.tail import cut_tail

    moved = 0.0
    for _ in range(12):
        logits = rng.normal(size=(2, 60)) * 5.0
        target, draft = (np.exp(row - row.max()) / np.exp(row - row.max()).sum() for row in logits)
        cut_target, cut_draft, dropped_target, dropped_draft, bound = cut_tail(target, draft, 1e-3, 3)
        exact_target, exact_draft, *no_drop = cut_tail(target, draft, 0.0, 3)
        assert no_drop == [0.0, 0.0, 0.0] and len(exact_target) == 60
        assert 0 < dropped_target + dropped_draft and bound <= 1e-3
        assert len(cut_target) < 60
        for num_drafts in (2, 3):
            for method in METHODS:
                full = method_acceptance(method, target[None], draft[None], num_drafts)[0]
                cut = method_acceptance(method, cut_target[None], cut_draft[None], num_drafts)[0]
                assert method_acceptance(method, exact_target[None], exact_draft[None], num_drafts)[0] == pytest.approx(full, abs=1e-12)
                assert abs(full - cut) <= bound, method
                moved = max(moved, abs(full - cut) / bound)
    assert moved > 0.05  # the cut does move the values: the bound is tested, not vacuous


def test_a_tail_budget_that_is_not_a_small_number_is_refused():
    for budget in (-1.0, 0.01, True, "1e-7"):
        with pytest.raises(ValueError, match="tail_budget"):
            AcceptanceStudy(tail_budget=budget)


@pytest.mark.parametrize("float32_faster", [True, False])
def test_float32_twins_prefill_and_score_while_the_model_decodes(float32_faster, monkeypatch):
    """A bf16 pair with float32 twins: where float32 is measured faster (AVX2-only CPUs),
    each twin runs the prompt's prefill once; everywhere the draft twin runs the one
    scoring forward; the target is never re-scored (the engine recorded its rows), and
    every decoding step runs in bf16."""
    import copy
    import dataclasses

    from specbound.engine.backends import torch as torch_backend

    monkeypatch.setattr(torch_backend, "float32_beats_bf16", lambda: float32_faster)
    float32_twin = torch_backend.BACKEND.float32_twin

    base = tiny_pair()
    target, draft = (copy.deepcopy(model).to(torch.bfloat16) for model in (base.target, base.draft))
    pair = dataclasses.replace(base, target=target, draft=draft,
                               target_twin=float32_twin(target), draft_twin=float32_twin(draft))
    calls = {name: 0 for name in ("target", "draft", "target_twin", "draft_twin")}
    for name in calls:
        getattr(pair, name).base_model.register_forward_hook(lambda *_, name=name: calls.__setitem__(name, calls[name] + 1))
    prompt_ids = pair.encode("abcdeabcdeabcdeabcde")  # 20 tokens: above the twin's 16
    processing = Processing(temperature=1.0)
    trace = generate_trace(pair, processing, build_method("chain", gamma=2), prompt_ids, 6,
                           torch.Generator().manual_seed(0), stop_at_eos=False)
    prefills = int(float32_faster)
    assert calls["target_twin"] == prefills and calls["draft_twin"] == prefills
    decoding_calls = dict(calls)
    target_rows, draft_rows = trace_probs(pair, trace, processing)
    assert calls["draft_twin"] == prefills + 1 and calls["target_twin"] == prefills
    assert calls["target"] == decoding_calls["target"] and calls["draft"] == decoding_calls["draft"]
    assert target_rows.shape == draft_rows.shape == (6, pair.vocab_size)
    np.testing.assert_array_equal(target_rows, trace.target_rows())


def test_worker_processes_give_the_records_of_one_process(tmp_path):
    """The exact computations split over two spawned processes (interleaved rows) must
    give exactly the records computed in this process."""
    import json

    prompts = tiny_prompts(2)
    records = []
    for workers in (1, 2):
        study = AcceptanceStudy(num_drafts=[2, 3], max_new_tokens=10, workers=workers)
        run_study(study, tiny_pair(), prompts, tmp_path / str(workers), "toy", seed=0, progress=False)
        lines = (tmp_path / str(workers) / "records.jsonl").read_text().splitlines()
        records.append([{key: value for key, value in json.loads(line).items() if key != "seconds"}
                        for line in lines])
    assert len(records[0]) > 20
    assert records[0] == records[1]
    assert study._pool is not None  # the second run did split the work
    # the pool the study keeps, on more rows than its block holds, then on fewer: one process's
    # values, and why a method has none as one process says it (its first position's reason)
    rows = np.random.default_rng(1).dirichlet(np.full(2000, 0.1), size=(2, 9))
    methods = ["optimal_greedy", "single", "rrs_without_replacement"]
    for positions in (5, 9, 4):
        target_rows, draft_rows = rows[0, :positions], rows[1, :positions]
        tails, acceptance, missing = study._pool.exact(methods, [6], study.tail_budget, target_rows, draft_rows)[6]
        alone = unit_exact_part(methods, [6], study.tail_budget, target_rows, draft_rows)[6]
        np.testing.assert_array_equal(tails, alone[0])
        assert {method: list(values) for method, values in acceptance.items()} == alone[1]
        assert missing == alone[2] and list(missing) == ["rrs_without_replacement"]
    # RRS without replacement at n = 4, which a row can refuse by estimate: the pool's first round
    # only estimates it; where no row refuses it, the second round computes it; where a later row
    # does, no row computes it and the reason is that row's, as in one process
    rng = np.random.default_rng(2)
    agreeing = rng.dirichlet(np.full(2000, 0.1), size=3)
    boosted = agreeing * np.where(np.arange(2000) < 30, 1.5, 1.0)  # 30 rejectable tokens
    boosted /= boosted.sum(axis=1, keepdims=True)
    cases = ((agreeing, boosted, True), (np.r_[agreeing[:2], rows[0, :1]], np.r_[boosted[:2], rows[1, :1]], False))
    for target_rows, draft_rows, computed in cases:
        exact = study._pool.exact(methods, [4, 6], study.tail_budget, target_rows, draft_rows)
        alone = unit_exact_part(methods, [4, 6], study.tail_budget, target_rows, draft_rows)
        for num_drafts in (4, 6):
            np.testing.assert_array_equal(exact[num_drafts][0], alone[num_drafts][0])
            assert {method: list(values) for method, values in exact[num_drafts][1].items()} == alone[num_drafts][1]
            assert exact[num_drafts][2] == alone[num_drafts][2]
        assert ("rrs_without_replacement" in exact[4][1]) == computed
        if computed:
            assert list(exact[4][1]) == methods
        else:
            assert list(exact[4][2]) == ["rrs_without_replacement"]
    # collected, the pool stops and joins its workers and releases its block
    workers, name = list(study._pool.executor._processes.values()), study._pool.blocks[0].name
    study._pool = None
    assert not any(worker.is_alive() for worker in workers)
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=name)
