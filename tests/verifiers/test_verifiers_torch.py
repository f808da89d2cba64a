"""The torch paths agree with the numpy reference on the same uniforms, for every
registered verifier, and keep working in float32 at a real vocabulary size."""

import numpy as np
import pytest
import torch

from support.instances import random_pair
from specbound.drafts import get_draft_scheme
from specbound.probability import ZeroResidualError, sample_from_torch
from specbound.verifiers import VERIFIERS, get_verifier

NATIVE = [name for name, verifier in VERIFIERS.items() if verifier.native_torch()]
PER_NODE = [name for name, verifier in VERIFIERS.items() if verifier.per_node]  # tree verifiers take whole trees


def num_drafts_of(verifier, default=3):
    return verifier.default_num_drafts(default)


def verify_torch_with_uniforms(verifier, *args):
    return verifier.verify_torch_with_uniforms(*args)


# the biased verifiers also at ε > 0, where their draft test and resampling law differ from
# speculative sampling's, and UNO with both of its resampling laws
BIASED = [("decoding_opt", {"epsilon": 0.05}), ("decoding_uno", {"epsilon": 0.05}),
          ("decoding_uno", {"epsilon": 0.05, "resample": "draft"})]


@pytest.mark.parametrize("name, parameters", [(n, {}) for n in PER_NODE if n != "optimal"] + BIASED)
def test_torch_path_agrees_with_numpy(name, parameters, rng):
    verifier = get_verifier(name, **parameters)
    num_drafts = num_drafts_of(verifier)
    batch, vocab = 400, 20
    pairs = [random_pair(rng, vocab, concentration=0.4, zeros=False) for _ in range(batch)]
    target = np.array([t for t, _ in pairs])
    draft = np.array([d for _, d in pairs])
    tokens = get_draft_scheme(verifier.scheme).sample(draft, num_drafts, rng)
    uniforms = rng.random((batch, num_drafts + 1))
    reference = verifier.verify_with_uniforms(target, draft, tokens, uniforms)
    fast = verify_torch_with_uniforms(
        verifier, torch.tensor(target), torch.tensor(draft), torch.tensor(tokens), torch.tensor(uniforms)
    )
    np.testing.assert_array_equal(fast.tokens.numpy(), reference.tokens)
    np.testing.assert_array_equal(fast.accepted.numpy(), reference.accepted)


@pytest.mark.parametrize("name", sorted(NATIVE))
def test_torch_path_runs_in_float32_at_real_vocabulary(name):
    generator = torch.Generator().manual_seed(0)
    target = torch.softmax(3 * torch.randn(8, 151_936, generator=generator), dim=-1)
    draft = torch.softmax(3 * torch.randn(8, 151_936, generator=generator), dim=-1)
    verifier = get_verifier(name)
    num_drafts = num_drafts_of(verifier)
    tokens = get_draft_scheme(verifier.scheme).sample_torch(draft, num_drafts, generator)
    verdict = verifier.verify_torch(target, draft, tokens, generator)
    assert verdict.tokens.shape == (8,) and verdict.tokens.dtype == torch.long
    assert bool(torch.all((verdict.tokens >= 0) & (verdict.tokens < 151_936)))


def test_a_narrow_rows_sum_may_be_off_by_vocabulary_times_unit_roundoff_and_no_more():
    """A float32 softmax's row sums to 1 within V·u whatever order its kernel sums in (on an
    AVX2-only CPU torch's lands past a fixed 64 ulps at a real vocabulary): at a
    V where V·u exceeds 64 ulps, a row off by 0.9·V·u is verified, one off by 1.1·V·u is
    refused, naming the argument."""
    vocab_size = 4096
    bound = vocab_size * torch.finfo(torch.float32).eps / 2
    draft = torch.full((1, vocab_size), 1 / vocab_size, dtype=torch.float32)
    tokens = torch.tensor([[0, 1]])
    uniforms = torch.full((1, 3), 0.5, dtype=torch.float64)
    for factor, accepted in ((0.9, True), (1.1, False)):
        target = draft.clone()
        target[0, 0] += factor * bound  # representable: 1/4096 + ~1.1e-4 is exact to float32's 24 bits
        assert abs(target.double().sum().item() - 1 - factor * bound) < 0.01 * bound
        if accepted:
            verify_torch_with_uniforms(get_verifier("rrs"), target, draft, tokens, uniforms)
        else:
            with pytest.raises(ValueError, match="target_probs: rows must sum to 1"):
                verify_torch_with_uniforms(get_verifier("rrs"), target, draft, tokens, uniforms)


def test_a_bf16_rows_sum_is_still_checked_at_a_real_vocabulary():
    """The V·u allowance is float32's u, the softmax's accumulator: with bf16's own u it would
    exceed 1 at V = 151,936 and let any row through. A bf16 row summing to 2 is refused; one
    summing to 1 is verified."""
    vocab_size = 151_936
    draft = torch.zeros((1, vocab_size), dtype=torch.bfloat16)
    draft[0, :2] = 0.5
    tokens = torch.tensor([[0, 1]])
    uniforms = torch.full((1, 3), 0.5, dtype=torch.float64)
    verify_torch_with_uniforms(get_verifier("rrs"), draft.clone(), draft, tokens, uniforms)
    target = draft.clone()
    target[0, :2] = 1.0
    with pytest.raises(ValueError, match="target_probs: rows must sum to 1"):
        verify_torch_with_uniforms(get_verifier("rrs"), target, draft, tokens, uniforms)


def test_torch_sampler_never_picks_zero_weight_and_guards_empty_rows():
    weights = torch.tensor([[0.0, 0.5, 0.0, 0.5], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    uniforms = torch.tensor([0.999999999, 0.3], dtype=torch.float64)
    chosen = sample_from_torch(weights, uniforms, torch.tensor([True, False]))
    assert chosen[0].item() == 3
    with pytest.raises(ZeroResidualError):
        sample_from_torch(weights, uniforms, torch.tensor([True, True]))


def test_torch_bad_input_raises():
    target = torch.full((1, 4), 0.25)
    with pytest.raises(ValueError, match="draft_tokens: token ids"):
        verify_torch_with_uniforms(get_verifier("rrs"), target, target, torch.tensor([[5, 0]]), torch.zeros(1, 3))
    with pytest.raises(ValueError, match="draft_probs: expected"):
        verify_torch_with_uniforms(get_verifier("rrs"), target, torch.full((1, 3), 1 / 3), torch.tensor([[1, 0]]), torch.zeros(1, 3))


FIXTURE_TARGET = torch.tensor([[0.4, 0.3, 0.2, 0.1]], dtype=torch.float64)
FIXTURE_DRAFT = torch.tensor([[0.1, 0.2, 0.3, 0.4]], dtype=torch.float64)


def with_entry(row, index, value):
    changed = row.clone()
    changed[0, index] = value
    return changed


# what is wrong: (target, draft, draft tokens, uniforms or None for 0.5, the message), on
# fixture A with n = 2 (n = 1 for single-draft verifiers: the first token)
NAN, INF = float("nan"), float("inf")
BAD_TORCH_INPUTS = {
    "NaN target": (with_entry(FIXTURE_TARGET, 1, NAN), FIXTURE_DRAFT, [[3, 2]], None,
                   "target_probs: probabilities must be finite"),
    "negative draft": (FIXTURE_TARGET, with_entry(FIXTURE_DRAFT, 0, -0.1), [[3, 2]], None,
                       "draft_probs: probabilities must be finite"),
    "infinite draft": (FIXTURE_TARGET, with_entry(FIXTURE_DRAFT, 0, INF), [[3, 2]], None,
                       "draft_probs: probabilities must"),
    "unnormalised target": (FIXTURE_TARGET * 0.9, FIXTURE_DRAFT, [[3, 2]], None, "target_probs: rows must sum to 1"),
    "zero draft probability": (FIXTURE_TARGET, torch.tensor([[0.5, 0.5, 0.0, 0.0]], dtype=torch.float64), [[3, 0]],
                               None, "draft_tokens: a draft token has zero draft probability"),
    "uniform of 1": (FIXTURE_TARGET, FIXTURE_DRAFT, [[3, 2]], [[0.5, 1.0, 0.5]], "uniforms: uniforms must lie in"),
    "negative uniform": (FIXTURE_TARGET, FIXTURE_DRAFT, [[3, 2]], [[0.5, -0.5, 0.5]], "uniforms: uniforms must lie in"),
    "float32 draft, float64 target": (FIXTURE_TARGET, FIXTURE_DRAFT.float(), [[3, 2]], None, "draft_probs: dtype"),
    "int32 tokens": (FIXTURE_TARGET, FIXTURE_DRAFT, torch.tensor([[3, 2]], dtype=torch.int32), None,
                     "draft_tokens: expected int64"),
    "integer target": (torch.tensor([[1, 0, 0, 0]]), torch.tensor([[1, 0, 0, 0]]), [[0, 0]], None,
                       "target_probs: expected a floating"),
    "numpy target": (FIXTURE_TARGET.numpy(), FIXTURE_DRAFT, [[3, 2]], None, "target_probs: expected a torch tensor"),
}


@pytest.mark.parametrize("name", [n for n in PER_NODE if n != "spechub"])
@pytest.mark.parametrize("case", sorted(BAD_TORCH_INPUTS))
def test_torch_path_checks_what_the_numpy_path_checks(name, case):
    """Each bad input is a ValueError naming the argument, on every path (native or not);
    they were verified or ended in a torch RuntimeError (issue #10)."""
    verifier = get_verifier(name)
    target, draft, tokens, uniforms, message = BAD_TORCH_INPUTS[case]
    tokens = tokens if isinstance(tokens, torch.Tensor) else torch.tensor(tokens)
    tokens = tokens[:, : verifier.default_num_drafts(tokens.shape[1])]
    if uniforms is None:
        uniforms = torch.full((1, tokens.shape[1] + 1), 0.5, dtype=torch.float64)
    else:
        uniforms = torch.tensor(uniforms, dtype=torch.float64)[:, -(tokens.shape[1] + 1):]
    with pytest.raises(ValueError, match=message):
        verify_torch_with_uniforms(verifier, target, draft, tokens, uniforms)


@pytest.mark.parametrize("name", ["rrs_without_replacement", "greedy", "spechub"])
def test_torch_path_refuses_repeated_drafts_where_the_scheme_draws_distinct_ones(name):
    with pytest.raises(ValueError, match="draft_tokens: the .* scheme draws distinct tokens"):
        verify_torch_with_uniforms(get_verifier(name), FIXTURE_TARGET, FIXTURE_DRAFT, torch.tensor([[3, 3]]),
                                   torch.full((1, 3), 0.5, dtype=torch.float64))


def test_torch_path_refuses_a_wrong_greedy_top_set_and_a_spechub_pair_without_its_hub():
    uniforms = torch.full((1, 3), 0.5, dtype=torch.float64)
    greedy, spechub = get_verifier("greedy"), get_verifier("spechub")
    with pytest.raises(ValueError, match="most probable"):  # token 0 is the least probable draft token
        verify_torch_with_uniforms(greedy, FIXTURE_TARGET, FIXTURE_DRAFT, torch.tensor([[0, 3]]), uniforms)
    with pytest.raises(ValueError, match="hub"):  # the hub is token 3
        verify_torch_with_uniforms(spechub, FIXTURE_TARGET, FIXTURE_DRAFT, torch.tensor([[0, 1]]), uniforms)
    ties = torch.tensor([[0.1, 0.3, 0.3, 0.3]], dtype=torch.float64)  # any most probable set will do
    verify_torch_with_uniforms(get_verifier("greedy"), FIXTURE_TARGET, ties, torch.tensor([[3, 2, 1]]),
                               torch.full((1, 4), 0.5, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(set(NATIVE) & set(PER_NODE)))
def test_half_precision_rows_are_verified_in_float32(name, dtype):
    """bf16/fp16 rows (here of exactly representable values k/256 summing to 1) give the
    verdicts of the same values in float32, uniform for uniform: the uniforms were cast
    to the rows' dtype, a grid of 2⁻⁸ near 1 in bf16, moving acceptance by up to 0.0027."""
    rng = np.random.default_rng(3)
    verifier = get_verifier(name)
    num_drafts = num_drafts_of(verifier, 2)
    batch, vocab = 2000, 8
    target = torch.tensor(rng.multinomial(256, np.full(vocab, 1 / vocab), size=batch) / 256)
    draft = torch.tensor(rng.multinomial(256, rng.dirichlet(np.ones(vocab)), size=batch) / 256)
    draft[:, 0] += 1 / 256  # every row has at least n tokens of positive draft probability
    draft[:, 1] += 1 / 256
    draft /= draft.sum(dim=-1, keepdim=True)
    draft = torch.round(draft * 256) / 256
    draft[:, -1] += 1 - draft.sum(dim=-1)
    keep = (draft >= 0).all(dim=-1) & ((draft > 0).sum(dim=-1) >= num_drafts)
    target, draft = target[keep], draft[keep]
    tokens = get_draft_scheme(verifier.scheme).sample_torch(draft, num_drafts, torch.Generator().manual_seed(0))
    uniforms = torch.tensor(rng.random((len(tokens), num_drafts + 1)))
    assert torch.equal(target.to(dtype).double(), target) and torch.equal(draft.to(dtype).double(), draft)
    in_float32 = verify_torch_with_uniforms(verifier, target.float(), draft.float(), tokens, uniforms)
    narrow = verify_torch_with_uniforms(verifier, target.to(dtype), draft.to(dtype), tokens, uniforms)
    assert torch.equal(narrow.tokens, in_float32.tokens)


@pytest.mark.parametrize("name", sorted(set(NATIVE) & set(PER_NODE)))
def test_a_uniform_that_rounds_to_one_in_float32_still_accepts_a_ratio_of_one(name):
    """A float64 uniform within 2⁻²⁵ of 1 became 1.0 in float32 and rejected a draft whose
    acceptance ratio is 1, leaving an empty residual (ZeroResidualError). One draft with
    p = q, or a SpecHub pair whose non-hub token has p(z) = q′(z)."""
    verifier = get_verifier(name)
    if verifier.fixed_num_drafts == 2:  # the hub is token 0, q′ = (0, 0.5, 0.5)
        target, draft, tokens = [[0.0, 0.5, 0.5]], [[0.5, 0.25, 0.25]], [[0, 1]]
    else:
        target, draft, tokens = [[0.25, 0.25, 0.5]], [[0.25, 0.25, 0.5]], [[1]]
    uniforms = torch.full((1, len(tokens[0]) + 1), 1.0 - 2.0**-30, dtype=torch.float64)
    verdict = verify_torch_with_uniforms(
        verifier, torch.tensor(target), torch.tensor(draft), torch.tensor(tokens), uniforms
    )
    assert verdict.tokens.tolist() == [1]


def test_torch_sampler_sums_half_precision_weights_in_float32():
    """In bf16 a running sum over 1000 weights of 1/1000 stalls near 1 (the sampler drew the
    last token for every uniform above ~0.5); its draws equal those of the float32 weights."""
    weights = torch.full((1, 1000), 1 / 1000, dtype=torch.bfloat16).repeat(500, 1)
    uniforms = torch.tensor(np.random.default_rng(0).random(500))
    expected = sample_from_torch(weights.float(), uniforms)
    np.testing.assert_array_equal(sample_from_torch(weights, uniforms).numpy(), expected.numpy())


@pytest.mark.parametrize("name", sorted(set(PER_NODE) - set(NATIVE)))
def test_numpy_fallback_takes_float32_rows_that_sum_to_one_only_within_rounding(name):
    """A float32 row over a large vocabulary sums to 1 only within ~1e-6 (seen on the
    default pair: 1.00000116); the fallback must verify it as the law it is, not refuse it."""
    generator = torch.Generator().manual_seed(0)
    target = torch.softmax(torch.randn(4, 12, generator=generator), dim=-1) * (1 + 3e-6)
    draft = torch.softmax(torch.randn(4, 12, generator=generator), dim=-1) * (1 - 3e-6)
    verifier = get_verifier(name)
    num_drafts = num_drafts_of(verifier, 2)
    tokens = get_draft_scheme(verifier.scheme).sample_torch(draft / draft.sum(-1, keepdim=True), num_drafts, generator)
    verdict = verifier.verify_torch(target, draft, tokens, generator)
    assert verdict.tokens.shape == (4,)
    with pytest.raises(ValueError, match="sum to 1"):  # a float64 row is checked as given
        verifier.verify_torch(target.double(), draft.double(), tokens, generator)
