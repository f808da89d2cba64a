"""End to end, every lossless method generates the target model's exact sequence law.

The law of the next 3 tokens (stopping at EOS) is enumerated with plain full forwards of
the tiny target model; the engine's samples are compared with a pooled χ² test at level
SIGNIFICANCE = 0.001 (cells pooled to expected counts >= 5). With 3 new tokens a depth-2
tree is used to its full depth, so residual tokens at every depth, bonus tokens at a
leaf, EOS stops and the max-length cut all occur.

Power, stated and checked in ``test_the_check_has_power``: with SAMPLES = 400 sequences
the test rejects the draft model's own sequence law (sequence TV 0.50) with probability
> 0.99 and a 20% contamination of the target law with the draft law (TV 0.10) with
probability about 0.78 (noncentral χ²). So these tests catch gross losses of exactness —
a wrong residual, a missing bonus, a draft law that differs from the sampled one — not
subtle ones; the verifiers' own exact tests cover the single-step math.
"""

import pytest
import torch

from support.models import (
    EOS,
    VOCAB,
    SIGNIFICANCE,
    chi_square_power,
    chi_square_pvalue,
    exact_sequence_law,
)
from support.lossless import (LOOKUP_PROMPT, LOSSLESS_CASES, NEW_TOKENS, PROMPT, SAMPLES, SLOW_CASES,
                              TREE_VERIFIER_CASES, model_decoder, sample_sequences)
from specbound.engine import CausalLM, Decoder, Processing, PromptLookupDrafter
from specbound.engine.methods import build_method
from specbound.verifiers import get_verifier

def check_lossless(case, target_model, draft_model):
    name, options, processing = case
    method = build_method(name, **options)
    samples = sample_sequences(model_decoder(target_model, draft_model, processing), method)
    law = exact_sequence_law(target_model, PROMPT, processing, NEW_TOKENS)
    pvalue = chi_square_pvalue(samples, law)
    assert pvalue > SIGNIFICANCE, f"{name} {options}: χ² p-value {pvalue:.2e}"


@pytest.mark.parametrize("case", LOSSLESS_CASES.values(), ids=LOSSLESS_CASES.keys())
def test_method_generates_the_target_sequence_law(case, target_model, draft_model):
    check_lossless(case, target_model, draft_model)


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW_CASES.values(), ids=SLOW_CASES.keys())
def test_more_tree_verifiers_generate_the_target_sequence_law(case, target_model, draft_model):
    check_lossless(case, target_model, draft_model)


def test_prompt_lookup_chain_generates_the_target_sequence_law(target_model):
    processing = Processing()
    drafter = PromptLookupDrafter(vocab_size=VOCAB)
    decoder = Decoder(CausalLM(target_model), drafter, processing, eos_token_ids=[EOS])
    samples = sample_sequences(decoder, build_method("chain", gamma=2), prompt=LOOKUP_PROMPT)
    law = exact_sequence_law(target_model, LOOKUP_PROMPT, processing, NEW_TOKENS)
    assert chi_square_pvalue(samples, law) > SIGNIFICANCE


@pytest.mark.parametrize("verifier", ["kseq", "rrs", "rrs_without_replacement", "greedy", "spechub"])
def test_point_mass_laws_give_the_target_argmax_path_with_every_verifier(verifier, target_model, draft_model):
    """top-k 1: both laws are point masses, on different tokens wherever the models' argmax
    differ (disjoint supports). Every sample must then be the target's greedy path: K-SEQ
    once emitted tokens of target probability 0 there in every sample (issue #10, part 1)."""
    processing = Processing(temperature=0.9, top_k=1)
    method = build_method("tree", num_drafts=2, depth=2, verifier=verifier)
    law = exact_sequence_law(target_model, PROMPT, processing, NEW_TOKENS)
    assert len(law) == 1  # the one sequence of positive probability
    decoder = model_decoder(target_model, draft_model, processing)
    generator = torch.Generator().manual_seed(0)
    samples = {tuple(decoder.generate(PROMPT, method, NEW_TOKENS, generator).tokens) for _ in range(50)}
    assert samples == set(law)


@pytest.mark.parametrize(
    "verifier", ["decoding_opt", pytest.param("decoding_uno", marks=pytest.mark.slow)]
)
def test_biased_chain_emits_the_verifiers_output_law(verifier, target_model, draft_model):
    """With ε > 0 the first token's law is the verifier's O = b·q + R·Σ(1 − b)q [YIN §3]
    (not p), and the second token — a bonus or a fresh step — is exact given the first:
    law(y, z) = O(y)·p(z | y). Two new tokens, so the step's depth is cut to 1."""
    processing = Processing()
    epsilon = 0.3
    method = build_method(verifier, gamma=2, epsilon=epsilon)
    samples = sample_sequences(model_decoder(target_model, draft_model, processing), method,
                               new_tokens=2)
    with torch.no_grad():
        target_root = processing.probs(target_model(input_ids=torch.tensor([PROMPT])).logits[:, -1])
        draft_root = processing.probs(draft_model(input_ids=torch.tensor([PROMPT])).logits[:, -1])
    first_law = get_verifier(verifier, epsilon=epsilon).output_distribution(
        target_root.numpy(), draft_root.numpy())[0]
    target_law = exact_sequence_law(target_model, PROMPT, processing, 2)
    law = {}
    for sequence, mass in target_law.items():
        first_prob = target_root[0, sequence[0]].item()
        law[sequence] = first_law[sequence[0]] * mass / first_prob
    assert sum(law.values()) == pytest.approx(1.0)
    assert chi_square_pvalue(samples, law) > SIGNIFICANCE
    # and the bias is visible: the samples do not follow the target's own law
    assert chi_square_pvalue(samples, target_law) < SIGNIFICANCE


def test_the_check_has_power(target_model, draft_model):
    processing = Processing()
    target_law = exact_sequence_law(target_model, PROMPT, processing, NEW_TOKENS)
    draft_law = exact_sequence_law(draft_model, PROMPT, processing, NEW_TOKENS)
    contaminated = {
        cell: 0.8 * target_law.get(cell, 0.0) + 0.2 * draft_law.get(cell, 0.0)
        for cell in set(target_law) | set(draft_law)
    }
    assert chi_square_power(target_law, draft_law, SAMPLES) > 0.99
    assert chi_square_power(target_law, contaminated, SAMPLES) > 0.7


@pytest.mark.parametrize("case", TREE_VERIFIER_CASES.values(), ids=TREE_VERIFIER_CASES.keys())
def test_whole_tree_verifiers_generate_the_target_sequence_law(case, target_model, draft_model):
    """Block (chains), traversal (trees, budgeted trees) and UniVer in the engine, EOS inside the
    block and the length cut included (3 new tokens below a depth-2 tree)."""
    check_lossless(case, target_model, draft_model)


@pytest.mark.parametrize("name, options", [("chain", {"gamma": 3}), ("chain", {"gamma": 3, "verifier": "block"}),
                                           ("tree", {"num_drafts": 2, "depth": 2}),
                                           ("tree", {"num_drafts": 2, "depth": 2, "verifier": "traversal"})])
def test_recorded_exact_expected_length_agrees_with_the_realised_counts(name, options, target_model, draft_model):
    """Averaged over steps, the exact per-step E[accepted | drafted tree] and the realised
    accepted count estimate the same mean: their difference is within 4 standard errors
    (the per-step differences have mean 0 given the trees; seeded)."""
    processing = Processing()
    decoder = model_decoder(target_model, draft_model, processing)
    method = build_method(name, **options)
    differences = []
    generators = [torch.Generator().manual_seed(11_000 + index) for index in range(150)]
    for generation in decoder.generate_batch([[1, 2]] * 150, method, 12, generators, record_expected=True):
        stats = generation.stats
        steps = [length for length, size in zip(stats.accepted_lengths, stats.tree_sizes) if size]
        differences += [realised - expected for realised, expected in zip(steps, stats.expected_lengths)]
    differences = torch.tensor(differences, dtype=torch.float64)
    assert len(differences) > 300
    assert abs(differences.mean()) <= 4 * differences.std() / len(differences) ** 0.5
