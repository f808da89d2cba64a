"""Recursive rejection sampling (SPEC.md §1, §4.3): single-draft speculative sampling [LEV],
RRS with i.i.d. drafts [SPECINFER] and RRS with drafts drawn without replacement.

RRS: residual p¹ = p; accept x_i with min(1, pⁱ(x_i)/qⁱ(x_i)); else
pⁱ⁺¹ = norm((pⁱ − qⁱ)+); if every draft is rejected, emit y ~ pⁿ⁺¹. With replacement
qⁱ = q; without replacement qⁱ⁺¹ is qⁱ with x_i removed and renormalised. Lossless.

Exact acceptance:
- with replacement, α = 1 − Π_i (1 − Σ min(pⁱ, q)) = 1 − |uⁿ⁺¹|, the residual chain kept
  unnormalised (``unaccepted_mass``), which never divides and is also [YIN]'s batch
  quantity Π_m r_m·p^{M+1} (``specbound.chains.theory``);
- without replacement there is no product formula: ``specbound.verifiers.rrs_exact``.

The numpy reference (``_rrs_steps``) and the engine's torch path (``_rrs_torch``) are
side by side and consume the same uniforms.
"""

from __future__ import annotations

import math

import numpy as np

from specbound.compiled import compiled
from specbound.probability import (normalize_mass, normalize_mass_torch, pairwise_sum, sample_from, sample_from_torch,
                                     take, zeroed)
from specbound.verifiers.base import Verifier, acceptance_ratio, register_verifier, residual_law
from specbound.verifiers.rrs_exact import recursion_refusal, rrs_without_replacement_acceptance


def unaccepted_mass(target_probs: np.ndarray, draft_probs: np.ndarray, num_drafts) -> np.ndarray:
    """Π_m r_m · p^{M+1}: the target mass that recursive rejection with M i.i.d. drafts
    fails to accept, as an unnormalised law of the residual token it then emits.

    Residual chain p¹ = p, p^{m+1} = norm((p^m − q)+), r_m = Σ (p^m − q)+ = TV(p^m, q). In
    unnormalised form u¹ = p, u^{m+1} = (u^m − |u^m| q)+ with |u^m| = Π_{k<m} r_k, so the
    total mass of the result is Π_{m≤M} r_m = P(all M drafts rejected) and no step divides
    (rows equal up to rounding give an exact 0, not a two-sided TV of 1e-17).

    ``num_drafts = math.inf`` gives the limit p · 1[q = 0]: every rejected draft removes at
    least |u^m| q(y) ≥ p(supp(q)ᶜ) q(y) from the mass at a draft-supported y, so that mass is
    used up after finitely many drafts when p(supp(q)ᶜ) > 0 (and the product tends to 0 when
    it is 0). So Π r_m → p(supp(q)ᶜ), which is 0 exactly when supp p ⊆ supp q.
    Unchecked rows of any batch shape.  # [..., vocab] x2 -> [..., vocab]
    """
    if num_drafts == math.inf:
        return np.where(draft_probs > 0, 0.0, target_probs)
    mass = target_probs
    for _ in range(int(num_drafts)):
        mass = np.maximum(mass - mass.sum(axis=-1, keepdims=True) * draft_probs, 0.0)
    return mass


@compiled(error_model="numpy")
def unaccepted_totals(target, draft, num_drafts):
    """|``unaccepted_mass``| per row, bit for bit as numpy computes it (each step's mass
    summed in numpy's order, ``probability.pairwise_sum``, then u − |u|·q clipped at 0 as
    ``np.maximum`` clips, NaN and −0 kept), in two passes a draft instead of numpy's five
    with their temporaries. # [batch, vocab] x2, int -> [batch]"""
    batch, size = target.shape
    totals = np.empty(batch)
    mass = np.empty(size)
    for row in range(batch):
        for token in range(size):
            mass[token] = target[row, token]
        for _ in range(num_drafts):
            total = pairwise_sum(mass, 0, size)
            for token in range(size):
                value = mass[token] - total * draft[row, token]
                mass[token] = 0.0 if value < 0.0 else value
        totals[row] = pairwise_sum(mass, 0, size)
    return totals


def _rrs_steps(target, draft, tokens, without_replacement, decide):
    """Walk RRS over the drafts; ``decide(i, accept_prob, reach)`` returns, per row, the
    probability mass (0/1 when sampling) with which draft i is taken. Returns the final
    residual [batch, vocab] and the probability [batch] of reaching it."""
    current_target, current_draft = target, draft
    reach = np.ones(target.shape[0])
    for i in range(tokens.shape[1]):
        token = tokens[:, i]
        accept = acceptance_ratio(take(current_target, token), take(current_draft, token))
        taken = decide(i, accept, reach)
        reach = reach - taken
        rejected = reach > 0
        if not np.any(rejected):
            break
        mass = np.maximum(current_target[rejected] - current_draft[rejected], 0.0)
        current_target = current_target.copy()
        current_target[rejected] = residual_law(mass, current_target[rejected])
        if without_replacement and i + 1 < tokens.shape[1]:
            current_draft = current_draft.copy()
            current_draft[rejected] = normalize_mass(
                zeroed(current_draft[rejected], token[rejected, None]), "draft"
            )
    return current_target, reach


def _rrs_torch(target, draft, tokens, uniforms, without_replacement):
    """Torch twin of the sampling walk of ``_rrs_steps``; no loop over batch or vocabulary.
    Like it, it stops once every row has taken a draft (the usual case after the first): the
    residuals and the final draw are then never needed, and the uniforms were drawn up front,
    so stopping changes no token. # target, draft [batch, vocab], tokens [batch, n], uniforms [batch, n + 1] -> [batch]"""
    import torch

    emitted = torch.full(tokens.shape[:1], -1, dtype=torch.long, device=tokens.device)
    pending = torch.ones(tokens.shape[:1], dtype=torch.bool, device=tokens.device)
    current_target, current_draft = target, draft
    for i in range(tokens.shape[1]):
        token = tokens[:, i : i + 1]  # [batch, 1]
        accept = acceptance_ratio(current_target.gather(1, token)[:, 0], current_draft.gather(1, token)[:, 0])
        taken = pending & (uniforms[:, i] < accept)
        emitted = torch.where(taken, token[:, 0], emitted)
        pending = pending & ~taken
        if not bool(pending.any()):  # one sync per draft: saves several passes over the vocabulary
            return emitted
        residual = residual_law((current_target - current_draft).clamp_min(0.0), current_target)
        current_target = torch.where(pending[:, None], residual, current_target)
        if without_replacement and i + 1 < tokens.shape[1]:
            shrunk = normalize_mass_torch(current_draft.scatter(1, token, 0.0), pending)
            current_draft = torch.where(pending[:, None], shrunk, current_draft)
    resampled = sample_from_torch(current_target, uniforms[:, -1], pending)
    return torch.where(pending, resampled, emitted)


class RecursiveRejection(Verifier):
    without_replacement = False

    def _verify(self, target, draft, tokens, uniforms):
        emitted = np.full(tokens.shape[0], -1)

        def decide(i, accept, reach):
            taken = (reach > 0) & (uniforms[:, i] < accept)
            emitted[taken] = tokens[taken, i]
            return taken.astype(float)

        final_residual, reach = _rrs_steps(target, draft, tokens, self.without_replacement, decide)
        rejected = reach > 0
        if np.any(rejected):
            emitted[rejected] = sample_from(final_residual[rejected], uniforms[rejected, -1])
        return emitted

    def _verify_torch(self, target, draft, tokens, uniforms):
        return _rrs_torch(target, draft, tokens, uniforms, self.without_replacement)

    def _output_law(self, target, draft, tokens):
        law = np.zeros_like(target)
        rows = np.arange(target.shape[0])

        def decide(i, accept, reach):
            np.add.at(law, (rows, tokens[:, i]), reach * accept)
            return reach * accept

        final_residual, reach = _rrs_steps(target, draft, tokens, self.without_replacement, decide)
        return law + reach[:, None] * final_residual

    def refuses_by_estimate(self, num_drafts: int) -> bool:
        return self.without_replacement and num_drafts >= 4

    def refusal_by_estimate(self, target_row, draft_row, num_drafts: int) -> str | None:
        """Without replacement: the recursion's estimate, n ≥ 4 (``rrs_exact.recursion_refusal``)."""
        return recursion_refusal(target_row, draft_row, num_drafts) if self.without_replacement else None

    def _acceptance_rate(self, target, draft, num_drafts):
        if self.without_replacement:
            return np.array([rrs_without_replacement_acceptance(t, d, num_drafts) for t, d in zip(target, draft)])
        if (num_drafts != math.inf and all(isinstance(rows, np.ndarray) and rows.ndim == 2 and rows.dtype == np.float64
                                           for rows in (target, draft))):  # checked rows: numpy's sums, compiled
            return 1.0 - unaccepted_totals(np.ascontiguousarray(target), np.ascontiguousarray(draft), int(num_drafts))
        return 1.0 - unaccepted_mass(target, draft, num_drafts).sum(axis=-1)


@register_verifier
class Single(RecursiveRejection):
    """Speculative sampling [LEV]: accept x ~ q with min(1, p(x)/q(x)), else emit from
    norm((p − q)+). Lossless; α = Σ min(p, q) = 1 − TV(p, q)."""

    name = "single"
    label = "single draft Σ min(p, q)"
    scheme = "with_replacement"
    fixed_num_drafts = 1


@register_verifier
class RRS(RecursiveRejection):
    """Recursive rejection sampling, i.i.d. drafts [SPECINFER]; α = 1 − Π(1 − Σ min(pⁱ, q))."""

    name = "rrs"
    label = "RRS (i.i.d.)"
    scheme = "with_replacement"


@register_verifier
class RRSWithoutReplacement(RecursiveRejection):
    """Recursive rejection sampling with drafts drawn without replacement; the draft law
    shrinks with each rejected token (SPEC.md §4.3). α by exact recursion
    (``specbound.verifiers.rrs_exact``)."""

    name = "rrs_without_replacement"
    label = "RRS without replacement"
    scheme = "without_replacement"
    without_replacement = True
