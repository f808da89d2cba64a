"""K-SEQ [SPECTR]: sequential acceptance of i.i.d. drafts with a common scale ρ* (SPEC.md §4.3).

β(ρ) = Σ min(p/ρ, q); p_acc(ρ) = 1 − (1 − β(ρ))ⁿ; ρ* solves p_acc(ρ) = ρ·β(ρ) on [1, n].
Accept x_i in turn with min(1, p(x_i)/(ρ*·q(x_i))); if none is accepted, emit from
norm((p − (p_acc/β)·min(p/ρ*, q))+). The residual sample may equal a draft, which counts as
accepted. Letters: p = target, q = draft (SPEC.md §0).

When target and draft share no support (β = 0) nothing can be accepted and the residual
is p itself: the formulas' 0/0 is resolved to that limit (p_acc/β → n as β → 0).

ρ* is found by bisection, each step one pass over the row for β (``kseq_scale``). Checked
rows (``bounds.rows.RowPairs``) hold the row sorted by p/q, where β costs O(log V) up to a
bounded rounding error; ``kseq_scale_of`` takes the same steps and makes the pass only for a
step that bound leaves open, so it returns the same ρ*, bit for bit.
"""

from __future__ import annotations

import numpy as np
import torch

from specbound.bounds.rows import RowPairs
from specbound.probability import sample_from, sample_from_torch, take
from specbound.verifiers.base import Verifier, acceptance_ratio, register_verifier, residual_law

BISECTION_STEPS = 200
EPS = np.finfo(float).eps
UNIT_ROUNDOFF = EPS / 2
SMALLEST_SUBNORMAL = np.finfo(float).smallest_subnormal
NEAR_TOKENS = 64  # at most this many ratios inside the bracket: β's near form sums them one by one


def kseq_scale(target, draft, num_drafts):
    """ρ* per row: the root on [1, n] of p_acc(ρ) = ρ·β(ρ), β(ρ) = Σ min(p/ρ, q),
    p_acc(ρ) = 1 − (1 − β(ρ))ⁿ [SPECTR]. p_acc − ρβ is decreasing in ρ, ≥ 0 at 1 and ≤ 0
    at n; bisection returns the upper end of the bracket, where p_acc ≤ ρβ, so the
    residual is non-negative without clipping. A row stops once its bracket is within
    4·eps of its upper end, so its ρ* does not depend on the rows beside it. numpy or torch alike.
    # [batch, vocab] x2 -> [batch]"""
    xp = torch if isinstance(target, torch.Tensor) else np
    if xp is torch:
        low = torch.ones(target.shape[0], dtype=target.dtype, device=target.device)
    else:
        low = np.ones(target.shape[0])
    high = low * float(num_drafts)
    eps = _eps(target)
    for _ in range(BISECTION_STEPS):
        working = ~(high - low <= 4 * eps * high)
        if not bool(working.any()):
            break
        middle = 0.5 * (low + high)
        above = _bracket_holds(target, draft, middle, num_drafts)
        low = xp.where(working & above, middle, low)
        high = xp.where(working & ~above, middle, high)
    return high


def _bracket_holds(target, draft, scale, num_drafts):
    """p_acc(ρ) ≥ ρ·β(ρ) per row, β summed over the whole row: the bisection's step.
    # [batch, vocab] x2, [batch] -> [batch] bool"""
    beta = (torch if isinstance(target, torch.Tensor) else np).minimum(target / scale[:, None], draft).sum(-1)
    return 1.0 - (1.0 - beta) ** num_drafts >= scale * beta


def _eps(array) -> float:
    return torch.finfo(array.dtype).eps if isinstance(array, torch.Tensor) else EPS


def kseq_scale_of(rows: RowPairs, num_drafts: int) -> np.ndarray:
    """``kseq_scale`` of checked rows, bit for bit: each row's bisection takes the same
    steps, a step decided by ``ScanBeta`` where its bound proves the pass over the row would
    decide it so, by that pass (``_bracket_holds``) where not.
    # rows [batch, vocab] -> [batch]"""
    scales = np.empty(rows.target.shape[0])
    for row in range(len(scales)):
        target, draft = rows.target[row : row + 1], rows.draft[row : row + 1]
        scan = ScanBeta(rows, row)
        low, high = 1.0, float(num_drafts)
        for _ in range(BISECTION_STEPS):
            if high - low <= 4 * EPS * high:
                break
            middle = 0.5 * (low + high)
            above = scan.decides(middle, num_drafts, low, high)
            if above is None:
                above = bool(_bracket_holds(target, draft, np.array([middle]), num_drafts)[0])
            low, high = (middle, high) if above else (low, middle)
        scales[row] = high
    return scales


class ScanBeta:
    """β(ρ) of one row from the row in scan order (p/q ascending, ``bounds.rows``), with a
    bound on its distance to the sum ``_bracket_holds`` computes, so that a bisection step
    is decided without that pass where the bound allows (``decides``). Two forms:

    - far: β ≈ P_k/ρ + (Q_V − Q_k), P, Q the running sums of p and q in scan order and
      k = #{p/q < ρ}; O(log V). Off by ≤ 4(V + 4)·u·(P_V + Q_V): each running sum is within
      V·u of its exact value (Q twice), a ratio within u of ρ is on either side, the
      division and the sum round once each, and the factor 2 covers second-order terms;
    - near, once the bracket [low, high] holds at most ``NEAR_TOKENS`` ratios:
      β ≈ S_P/ρ + S_Q + Σ_{low ≤ p/q ≤ high} min(p/ρ, q), S_P = Σ_{p/q < low} p and
      S_Q = Σ_{p/q > high} q summed pairwise once; valid for every ρ in that bracket and off
      by ≤ 2(A + M + 8)·u·(S_P + S_Q + Σ_middle q), A as in ``_pairwise_additions``, M the
      tokens summed one by one.
    Quotients p/ρ below the normal range add V·2⁻¹⁰⁷⁴ to either bound.

    u = 2⁻⁵³. Letters: p = target, q = draft (SPEC.md §0)."""

    def __init__(self, rows: RowPairs, row: int):
        self.target, self.draft = rows.target_in_scan_order[row], rows.draft_in_scan_order[row]  # [vocab]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            self.ratio = self.target / self.draft  # ascending, NaN (p = q = 0) last, as the scan order
        self.target_inside, self.draft_inside = rows.target_inside[row], rows.draft_inside[row]  # [vocab + 1]
        vocab_size = len(self.ratio)
        self.subnormal_error = vocab_size * SMALLEST_SUBNORMAL  # quotients p/ρ below the normal range
        self.pass_terms = _pairwise_additions(vocab_size) + 2
        self.far_error = (4 * (vocab_size + 4) * UNIT_ROUNDOFF * (self.target_inside[-1] + self.draft_inside[-1])
                          + self.subnormal_error)
        self.near = None  # (S_P, S_Q, [(p, q) of the tokens inside the bracket], error) once narrowed

    def decides(self, scale: float, num_drafts: int, low: float, high: float) -> bool | None:
        """Whether ``_bracket_holds`` is true at ``scale`` (in [low, high]), where the bound
        settles it; None where not. Narrows to the near form when the far one cannot settle it."""
        decision = self._certain(scale, num_drafts)
        if decision is None and self.near is None and self._narrow(low, high):
            decision = self._certain(scale, num_drafts)
        return decision

    def _narrow(self, low: float, high: float) -> bool:
        start = int(np.searchsorted(self.ratio, low, side="left"))
        stop = int(np.searchsorted(self.ratio, high, side="right"))
        if stop - start > NEAR_TOKENS:
            return False
        below, above = float(self.target[:start].sum()), float(self.draft[stop:].sum())
        middle = list(zip(self.target[start:stop].tolist(), self.draft[start:stop].tolist()))
        terms = _pairwise_additions(max(start, len(self.ratio) - stop)) + len(middle) + 8
        error = 2 * terms * UNIT_ROUNDOFF * (below + above + sum(q for _, q in middle)) + self.subnormal_error
        self.near = (below, above, middle, error)
        return True

    def _estimate(self, scale: float) -> tuple[float, float]:
        """β at ``scale`` and a bound on its distance to the exact Σ min(p/ρ, q)."""
        if self.near is not None:
            below, above, middle, error = self.near
            return below / scale + above + sum(min(p / scale, q) for p, q in middle), error
        index = int(self.ratio.searchsorted(scale))
        inside = float(self.target_inside[index]) / scale
        return inside + (float(self.draft_inside[-1]) - float(self.draft_inside[index])), self.far_error

    def _certain(self, scale: float, num_drafts: int) -> bool | None:
        """``_bracket_holds`` at ``scale`` when h(β) = 1 − (1 − β)ⁿ − ρβ is away from 0 by more
        than rounding can move it. The pass's sum β_f is within E = e + (A + 2)·u·(β + e) of
        the estimate β (e: the estimate's bound, subnormal quotients included; A: additions a
        term meets in numpy's pairwise sum, ``_pairwise_additions``; each term's own rounding
        u; the pass's subnormal quotients). Between β and β_f,
        |h'| = |n(1 − β)ⁿ⁻¹ − ρ| ≤ L = n·(|1 − β| + E)ⁿ⁻¹ + ρ, and h computed in floats is
        within e_h = (4n + 64)·u of h (1 − β, a pow() within 16 ulps, 1 − ·, ρ·β and the
        difference). So |h(β)| > L·E + 2·e_h gives h(β_f) the same sign, and the pass's
        comparison; the margin takes 2·L·E for the rounding of L and of itself."""
        beta, error = self._estimate(scale)
        error += self.pass_terms * UNIT_ROUNDOFF * (beta + error) + self.subnormal_error
        slope = num_drafts * (abs(1.0 - beta) + error) ** (num_drafts - 1) + scale
        margin = 2.0 * slope * error + 2 * (4 * num_drafts + 64) * UNIT_ROUNDOFF
        gap = 1.0 - (1.0 - beta) ** num_drafts - scale * beta
        if gap > margin:
            return True
        if gap < -margin:
            return False
        return None


def _pairwise_additions(length: int) -> int:
    """At most how many additions a term meets in numpy's sum of ``length`` contiguous
    values: pairwise halving (one per level, ≤ bit length) down to blocks of ≤ 128 summed
    in 8 running sums (≤ 15 + 3 + 7), plus one per chunk of 8192 should the reduction be
    buffered; 32 covers the block and the slack. Its error is then ≤ A·u·Σ|terms| (to first order)."""
    return 32 + length.bit_length() + length // 8192


def kseq_parts(target, draft, num_drafts, scale=None):
    """(ρ*, β, p_acc/β, leftover) per row: leftover = (p − (p_acc/β)·min(p/ρ*, q))+, the
    unnormalised residual. With β = 0, p_acc/β is its limit n and leftover = p. ``scale``:
    ρ* when known (``kseq_scale_of``), else ``kseq_scale``.
    # [batch, vocab] x2, scale [batch] or None -> [batch, 1] x3, [batch, vocab]"""
    xp = torch if isinstance(target, torch.Tensor) else np
    scale = (kseq_scale(target, draft, num_drafts) if scale is None else scale)[:, None]
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

    def acceptance_rate_of(self, rows: RowPairs, num_drafts: int) -> np.ndarray:
        """``acceptance_rate`` of checked rows, ρ* from their scan order (``kseq_scale_of``).  # -> [batch]"""
        self.check_num_drafts(num_drafts, support=rows.support)
        return self._acceptance_rate(rows.target, rows.draft, num_drafts, kseq_scale_of(rows, num_drafts))

    def _acceptance_rate(self, target, draft, num_drafts, scale=None):
        _, beta, accepted_mass, leftover = kseq_parts(target, draft, num_drafts, scale)
        none_accepted = (1.0 - beta[:, 0]) ** num_drafts
        live = none_accepted > 0
        hits = np.zeros(target.shape[0])
        if np.any(live):
            rejected_draft = (draft[live] - accepted_mass[live]) / (1.0 - beta[live])
            residual = residual_law(leftover[live], target[live])
            hits[live] = (residual * (1.0 - (1.0 - rejected_draft) ** num_drafts)).sum(axis=1)
        return 1.0 - none_accepted + none_accepted * hits
