"""Hu et al.'s greedy verifier and SpecHub [HU, SPECHUB] (SPEC.md §4.3): both attain
α*_greedy of their draft sets (``specbound.drafts.greedy``).

With the top set T (the greedy scheme's n − 1 most probable tokens, or SpecHub's hub) and
the sampled last draft x_n ~ q′ = q·1[∉T]/(1 − q(T)): emit x_n with min(1, p(x_n)/q′(x_n)),
else emit y ~ norm(p·1[y∈T] + (p − q′)+·1[y∉T]). Lossless, and its acceptance is
p(T) + Σ_{x∉T} min(p(x), q′(x)) = α*_greedy. SpecHub routes the excess mass through its hub
in exactly this way with T = {a}. Letters: p = target, q = draft (SPEC.md §0).
"""

from __future__ import annotations

import numpy as np

from specbound.drafts.greedy import restricted_draft
from specbound.probability import is_tensor, sample_from, sample_from_torch, take, top_tokens, zeroed
from specbound.verifiers.base import Verifier, acceptance_ratio, register_verifier, residual_law


def _leftover(target, in_top, rest_draft):
    """The unnormalised residual p·1[T] + (p − q′)+·1[∉T], numpy or torch."""
    if is_tensor(target):
        import torch

        return torch.where(in_top, target, (target - rest_draft).clamp_min(0.0))
    return np.where(in_top, target, np.maximum(target - rest_draft, 0.0))


NOT_A_TOP_SET = "draft_tokens: the first n-1 greedy drafts must be the n-1 most probable draft tokens"
NO_HUB = "draft_tokens: a SpecHub pair must contain the hub argmax q"


def _check_top_set(draft, top):
    """The first n−1 greedy drafts must be a most-probable set of q."""
    if top.shape[1] == 0:
        return
    smallest_in_top = np.take_along_axis(draft, top, axis=1).min(axis=1)
    outside = zeroed(draft, top).max(axis=1)
    if np.any(smallest_in_top < outside):
        raise ValueError(NOT_A_TOP_SET)


@register_verifier
class Greedy(Verifier):
    """Hu et al.'s greedy verifier (module docstring); α = α*_greedy."""

    name = "greedy"
    label = "greedy verifier"
    scheme = "greedy"
    attains_optimum = True

    def _ordered(self, draft, tokens):
        """(top set [batch, n−1], sampled last draft [batch]) in the greedy layout."""
        _check_top_set(draft, tokens[:, :-1])
        return tokens[:, :-1], tokens[:, -1]

    def _ordered_torch(self, draft, tokens):
        return tokens[:, :-1], tokens[:, -1:]

    def _verify(self, target, draft, tokens, uniforms):
        top, last = self._ordered(draft, tokens)
        in_top, rest_draft = restricted_draft(draft, top)
        accept = acceptance_ratio(take(target, last), take(rest_draft, last))
        emitted = last.copy()
        rejected = uniforms[:, 0] >= accept
        if np.any(rejected):
            leftover = _leftover(target[rejected], in_top[rejected], rest_draft[rejected])
            emitted[rejected] = sample_from(residual_law(leftover, target[rejected]), uniforms[rejected, -1])
        return emitted

    def _verify_torch(self, target, draft, tokens, uniforms):
        import torch

        top, last = self._ordered_torch(draft, tokens)
        in_top = torch.zeros_like(target, dtype=torch.bool).scatter(1, top, True)
        rest_draft = draft.masked_fill(in_top, 0.0)
        if top.shape[1] > 0 and bool(torch.any(draft.gather(1, top).amin(dim=-1) < rest_draft.amax(dim=-1))):
            raise ValueError(NOT_A_TOP_SET)
        rest_draft = rest_draft / rest_draft.sum(dim=-1, keepdim=True)
        accept = acceptance_ratio(target.gather(1, last)[:, 0], rest_draft.gather(1, last)[:, 0])
        rejected = uniforms[:, 0] >= accept
        leftover = _leftover(target, in_top, rest_draft)
        # residual_law's weights, unnormalised (the inverse-CDF sampler does not need it)
        weights = torch.where(leftover.sum(dim=-1, keepdim=True) > 0, leftover, target)
        resampled = sample_from_torch(weights, uniforms[:, -1], rejected)
        return torch.where(rejected, resampled, last[:, 0])

    def _output_law(self, target, draft, tokens):
        top, last = self._ordered(draft, tokens)
        in_top, rest_draft = restricted_draft(draft, top)
        accept = acceptance_ratio(take(target, last), take(rest_draft, last))
        law = np.zeros_like(target)
        np.put_along_axis(law, last[:, None], accept[:, None], axis=1)
        live = accept < 1
        leftover = _leftover(target[live], in_top[live], rest_draft[live])
        law[live] += (1.0 - accept[live, None]) * residual_law(leftover, target[live])
        return law

    def _acceptance_rate(self, target, draft, num_drafts):
        return self.draft_scheme.optimum(target, draft, num_drafts).acceptance


@register_verifier
class SpecHub(Greedy):
    """SpecHub [SPECHUB], n = 2, with SpecHub pairs around the hub a = argmax q. Its pair
    *set* has the greedy law ({a, z}, z ~ q(·|≠a)), and its verifier routes the excess mass
    through the hub: emit z with min(1, p(z)/q′(z)), else emit a with probability
    p(a)/P(reject) and otherwise from norm((p − q′)+) off the hub — the greedy verifier
    with T = {a}, so α = p(a) + Σ_{z≠a} min(p(z), q′(z)) = α*_greedy(n = 2)."""

    name = "spechub"
    label = "SpecHub (n = 2)"
    scheme = "spechub"
    fixed_num_drafts = 2

    def _ordered(self, draft, tokens):
        hub = top_tokens(draft, 1)[:, 0]
        if np.any((tokens[:, 0] != hub) & (tokens[:, 1] != hub)):
            raise ValueError(NO_HUB)
        other = np.where(tokens[:, 0] == hub, tokens[:, 1], tokens[:, 0])
        return hub[:, None], other

    def _ordered_torch(self, draft, tokens):
        import torch

        hub = top_tokens(draft, 1)
        if bool(torch.any((tokens[:, :1] != hub) & (tokens[:, 1:] != hub))):
            raise ValueError(NO_HUB)
        other = torch.where(tokens[:, :1] == hub, tokens[:, 1:], tokens[:, :1])
        return hub, other
