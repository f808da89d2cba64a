"""K-SEQ [SPECTR]: sequential acceptance of i.i.d. drafts with a common scale ρ* (SPEC.md §4.3).

β(ρ) = Σ min(p/ρ, q); p_acc(ρ) = 1 − (1 − β(ρ))ⁿ; ρ* solves p_acc(ρ) = ρ·β(ρ) on [1, n].
Accept x_i in turn with min(1, p(x_i)/(ρ*·q(x_i))); if none is accepted, emit from
norm((p − (p_acc/β)·min(p/ρ*, q))+). The residual sample may equal a draft, which counts as
accepted. Letters: p = target, q = draft (SPEC.md §0).

When target and draft share no support (β = 0) nothing can be accepted and the residual
is p itself: the formulas' 0/0 is resolved to that limit (p_acc/β → n as β → 0).
"""

from __future__ import annotations

import numpy as np
import torch

from specbound.probability import sample_from, sample_from_torch, take
from specbound.verifiers.base import Verifier, acceptance_ratio, register_verifier, residual_law

BISECTION_STEPS = 200


def kseq_scale(target, draft, num_drafts):
    """ρ* per row: the root on [1, n] of p_acc(ρ) = ρ·β(ρ), β(ρ) = Σ min(p/ρ, q),
    p_acc(ρ) = 1 − (1 − β(ρ))ⁿ [SPECTR]. p_acc − ρβ is decreasing in ρ, ≥ 0 at 1 and ≤ 0
    at n; bisection returns the upper end of the bracket, where p_acc ≤ ρβ, so the
    residual is non-negative without clipping. numpy or torch alike.
    # [batch, vocab] x2 -> [batch]"""
    xp = torch if isinstance(target, torch.Tensor) else np
    if xp is torch:
        low = torch.ones(target.shape[0], dtype=target.dtype, device=target.device)
    else:
        low = np.ones(target.shape[0])
    high = low * float(num_drafts)
    for _ in range(BISECTION_STEPS):
        middle = 0.5 * (low + high)
        beta = xp.minimum(target / middle[:, None], draft).sum(-1)
        above = 1.0 - (1.0 - beta) ** num_drafts >= middle * beta
        low = xp.where(above, middle, low)
        high = xp.where(above, high, middle)
        if bool((high - low <= 4 * _eps(target) * high).all()):
            break
    return high


def _eps(array) -> float:
    return torch.finfo(array.dtype).eps if isinstance(array, torch.Tensor) else np.finfo(float).eps


def kseq_parts(target, draft, num_drafts):
    """(ρ*, β, p_acc/β, leftover) per row: leftover = (p − (p_acc/β)·min(p/ρ*, q))+, the
    unnormalised residual. With β = 0, p_acc/β is its limit n and leftover = p.
    # [batch, vocab] x2 -> [batch, 1] x3, [batch, vocab]"""
    xp = torch if isinstance(target, torch.Tensor) else np
    scale = kseq_scale(target, draft, num_drafts)[:, None]
    accepted_mass = xp.minimum(target / scale, draft)  # q·a
    beta = accepted_mass.sum(-1)[:, None]
    p_acc = 1.0 - (1.0 - beta) ** num_drafts
    factor = xp.where(beta > 0, p_acc / xp.where(beta > 0, beta, 1.0), float(num_drafts))
    leftover = target - factor * accepted_mass
    leftover = leftover.clamp_min(0.0) if xp is torch else np.maximum(leftover, 0.0)
    return scale, beta, accepted_mass, leftover


@register_verifier
class KSeq(Verifier):
    """K-SEQ [SPECTR], i.i.d. drafts (module docstring). Exact acceptance
    α = p_acc + (1 − β)ⁿ Σ_y r(y)(1 − (1 − w(y))ⁿ), r = the normalised leftover,
    w(y) = q(y)(1 − a(y))/(1 − β) the law of a rejected draft."""

    name = "kseq"
    label = "K-SEQ (i.i.d.)"
    scheme = "with_replacement"

    def _verify(self, target, draft, tokens, uniforms):
        scale, _, _, leftover = kseq_parts(target, draft, tokens.shape[1])
        emitted = np.full(tokens.shape[0], -1)
        pending = np.ones(tokens.shape[0], dtype=bool)
        for i in range(tokens.shape[1]):
            token = tokens[:, i]
            accept = acceptance_ratio(take(target, token), scale[:, 0] * take(draft, token))
            taken = pending & (uniforms[:, i] < accept)
            emitted[taken] = token[taken]
            pending &= ~taken
        if np.any(pending):
            emitted[pending] = sample_from(residual_law(leftover[pending], target[pending]), uniforms[pending, -1])
        return emitted

    def _verify_torch(self, target, draft, tokens, uniforms):
        scale, _, _, leftover = kseq_parts(target, draft, tokens.shape[1])
        emitted = torch.full(tokens.shape[:1], -1, dtype=torch.long, device=tokens.device)
        pending = torch.ones(tokens.shape[:1], dtype=torch.bool, device=tokens.device)
        for i in range(tokens.shape[1]):
            token = tokens[:, i : i + 1]
            accept = acceptance_ratio(target.gather(1, token)[:, 0], scale[:, 0] * draft.gather(1, token)[:, 0])
            taken = pending & (uniforms[:, i] < accept)
            emitted = torch.where(taken, token[:, 0], emitted)
            pending = pending & ~taken
        resampled = sample_from_torch(residual_law(leftover, target), uniforms[:, -1], pending)
        return torch.where(pending, resampled, emitted)

    def _output_law(self, target, draft, tokens):
        scale, _, _, leftover = kseq_parts(target, draft, tokens.shape[1])
        law = np.zeros_like(target)
        rows = np.arange(target.shape[0])
        reach = np.ones(target.shape[0])
        for i in range(tokens.shape[1]):
            token = tokens[:, i]
            accept = acceptance_ratio(take(target, token), scale[:, 0] * take(draft, token))
            np.add.at(law, (rows, token), reach * accept)
            reach = reach * (1.0 - accept)
        live = reach > 0
        law[live] += reach[live, None] * residual_law(leftover[live], target[live])
        return law

    def _acceptance_rate(self, target, draft, num_drafts):
        _, beta, accepted_mass, leftover = kseq_parts(target, draft, num_drafts)
        none_accepted = (1.0 - beta[:, 0]) ** num_drafts
        live = none_accepted > 0
        hits = np.zeros(target.shape[0])
        if np.any(live):
            rejected_draft = (draft[live] - accepted_mass[live]) / (1.0 - beta[live])
            residual = residual_law(leftover[live], target[live])
            hits[live] = (residual * (1.0 - (1.0 - rejected_draft) ** num_drafts)).sum(axis=1)
        return 1.0 - none_accepted + none_accepted * hits
