"""The torch paths agree with the numpy reference on the same uniforms, for every
registered verifier, and keep working in float32 at a real vocabulary size."""

import numpy as np
import pytest
import torch

from instances import random_pair
from specbound.drafts import get_draft_scheme
from specbound.probability import ZeroResidualError, sample_from_torch
from specbound.verifiers import VERIFIERS, get_verifier

NATIVE = [name for name, verifier in VERIFIERS.items() if verifier.native_torch()]
PER_NODE = [name for name, verifier in VERIFIERS.items() if verifier.per_node]  # tree verifiers take whole trees


def num_drafts_of(verifier, default=3):
    return verifier.default_num_drafts(default)


def verify_torch_with_uniforms(verifier, *args):
    return verifier.verify_torch_with_uniforms(*args)


@pytest.mark.parametrize("name", [n for n in PER_NODE if n != "optimal"])
def test_torch_path_agrees_with_numpy(name, rng):
    verifier = get_verifier(name)
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
