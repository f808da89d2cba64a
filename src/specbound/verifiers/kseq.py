"""K-SEQ [SPECTR]: sequential acceptance of i.i.d. drafts with a common scale ρ* (SPEC.md §4.3).

β(ρ) = Σ min(p/ρ, q); p_acc(ρ) = 1 − (1 − β(ρ))ⁿ; ρ* solves p_acc(ρ) = ρ·β(ρ) on [1, n].
Accept x_i in turn with min(1, p(x_i)/(ρ*·q(x_i))); if none is accepted, emit from
norm((p − (p_acc/β)·min(p/ρ*, q))+). The residual sample may equal a draft, which counts as
accepted. Letters: p = target, q = draft (SPEC.md §0).

When target and draft share no support (β = 0) nothing can be accepted and the residual
is p itself: the formulas' 0/0 is resolved to that limit (p_acc/β → n as β → 0).

ρ* is found by bisection, each step one pass over the row for β (``kseq_scale``). Checked
rows (``bounds.rows.RowPairs``) hold the row sorted by p/q, where β costs O(log V) up to a
bounded rounding error; ``kseq_scale_of`` takes the same steps in one compiled loop per row
(numba) and makes the pass only for a step that bound leaves open, summing as numpy does,
so it returns the same ρ*, bit for bit. The exact acceptance is one compiled loop per row
too (``kseq_acceptance``).
"""

from __future__ import annotations

import numpy as np

from specbound.bounds.rows import RowPairs
from specbound.compiled import compiled
from specbound.probability import array_module, is_tensor, pairwise_sum, sample_from, sample_from_torch, take
from specbound.verifiers.base import Verifier, acceptance_ratio, register_verifier, residual_law

BISECTION_STEPS = 200
EPS = np.finfo(float).eps
UNIT_ROUNDOFF = EPS / 2
SMALLEST_SUBNORMAL = np.finfo(float).smallest_subnormal
NEAR_TOKENS = 64  # at most this many ratios inside the bracket: β's near form sums them one by one
# scan_bisection's state: one float array, so that a compiled call can stop and be resumed
LOW, HIGH = 0, 1  # the bracket on ρ
PENDING_BETA, POWER = 2, 3  # a pass's β awaiting numpy's (1 − β)ⁿ (NaN if none), and that power
NEAR = 4  # near_form's five values from here on: start (−1 until narrowed), stop, S_P, S_Q, factor
STATE_SIZE = NEAR + 5


def kseq_scale(target, draft, num_drafts):
    """ρ* per row: the root on [1, n] of p_acc(ρ) = ρ·β(ρ), β(ρ) = Σ min(p/ρ, q),
    p_acc(ρ) = 1 − (1 − β(ρ))ⁿ [SPECTR]. p_acc − ρβ is decreasing in ρ, ≥ 0 at 1 and ≤ 0
    at n; bisection returns the upper end of the bracket, where p_acc ≤ ρβ, so the
    residual is non-negative without clipping. A row stops once its bracket is within
    4·eps of its upper end, so its ρ* does not depend on the rows beside it. numpy or torch alike.
    # [batch, vocab] x2 -> [batch]"""
    xp = array_module(target)
    if xp is not np:
        low = xp.ones(target.shape[0], dtype=target.dtype, device=target.device)
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
    beta = array_module(target).minimum(target / scale[:, None], draft).sum(-1)
    return 1.0 - (1.0 - beta) ** num_drafts >= scale * beta


def _eps(array) -> float:
    return array_module(array).finfo(array.dtype).eps if is_tensor(array) else EPS


def kseq_scale_of(rows: RowPairs, num_drafts: int) -> np.ndarray:
    """``kseq_scale`` of checked rows, bit for bit: each row's bisection takes the same
    steps (``scan_bisection``), a step decided by the scan-order estimate where its bound
    proves the pass over the row would decide it so, by that pass where not. The pass sums
    in numpy's order (``probability.pairwise_sum``); where its comparison hangs on the last
    bits of numpy's power (1 − β)ⁿ, that power is numpy's own, computed here and handed back.
    # rows [batch, vocab] -> [batch]"""
    scales = np.empty(rows.target.shape[0])
    for row in range(len(scales)):
        arrays = (rows.target[row], rows.draft[row], rows.target_in_scan_order[row], rows.draft_in_scan_order[row],
                  rows.target_inside[row], rows.draft_inside[row])
        state = np.zeros(STATE_SIZE)
        state[LOW], state[HIGH] = 1.0, float(num_drafts)
        state[PENDING_BETA], state[NEAR] = np.nan, -1
        while scan_bisection(*arrays, num_drafts, state):
            state[POWER] = ((1.0 - state[PENDING_BETA:PENDING_BETA + 1]) ** num_drafts)[0]  # numpy's array power
        scales[row] = state[HIGH]
    return scales


@compiled(error_model="numpy")
def scan_bisection(target, draft, target_in_order, draft_in_order, target_inside, draft_inside, num_drafts, state):
    """``kseq_scale``'s bisection of one row, resumable: ``state`` holds the bracket [low, high],
    a pass's β awaiting numpy's power (NaN if none) and that power, and the near form
    (start −1 until narrowed). Each step is decided by β's estimate from the scan order where
    its bound settles it (``far_estimate``; once the bracket holds at most ``NEAR_TOKENS``
    ratios, ``near_form``; ``certain``), else by the pass: β summed over the row as
    ``_bracket_holds`` sums it (``probability.pairwise_sum``), and its comparison p_acc ≥ ρβ
    (``pass_decision``). Returns True with the state saved where that comparison needs
    numpy's (1 − β)ⁿ, to be called again with it in ``state[POWER]``; False, the bracket in
    ``state[LOW]``, ``state[HIGH]``, once it is narrow enough.
    # [vocab] x4 (id order, scan order), [vocab + 1] x2, int, [STATE_SIZE] -> bool"""
    low, high = state[LOW], state[HIGH]
    near = (int(state[NEAR]), int(state[NEAR + 1]), state[NEAR + 2], state[NEAR + 3], state[NEAR + 4])
    vocab_size = target.size
    subnormal_error = vocab_size * SMALLEST_SUBNORMAL
    pass_terms = pairwise_additions(vocab_size) + 2
    terms = np.empty(vocab_size)
    for _ in range(BISECTION_STEPS):
        if high - low <= 4 * EPS * high:
            break
        middle = 0.5 * (low + high)
        if state[PENDING_BETA] == state[PENDING_BETA]:  # this step's pass, with numpy's power
            decision = 1 if 1.0 - state[POWER] >= middle * state[PENDING_BETA] else 0
            state[PENDING_BETA] = np.nan
        else:
            for _ in range(2):  # the estimate, then once narrowed to the near form
                if near[0] < 0:
                    beta, error = far_estimate(target_in_order, draft_in_order, target_inside, draft_inside, middle)
                else:
                    beta, error = near_estimate(target_in_order, draft_in_order, near, middle)
                decision = certain(beta, error, middle, num_drafts, pass_terms, subnormal_error)
                if decision >= 0 or near[0] >= 0:
                    break
                near = near_form(target_in_order, draft_in_order, low, high)
                if near[0] < 0:
                    break
            if decision < 0:
                for token in range(vocab_size):
                    quotient = target[token] / middle
                    terms[token] = quotient if quotient < draft[token] else draft[token]
                beta = pairwise_sum(terms, 0, vocab_size)
                decision = pass_decision(beta, middle, num_drafts)
                if decision < 0:
                    state[LOW], state[HIGH], state[PENDING_BETA] = low, high, beta
                    state[NEAR], state[NEAR + 1], state[NEAR + 2], state[NEAR + 3], state[NEAR + 4] = near
                    return True
        if decision == 1:
            low = middle
        else:
            high = middle
    state[LOW], state[HIGH] = low, high
    return False


@compiled
def pass_decision(beta, scale, num_drafts):
    """``_bracket_holds``'s comparison 1 − (1 − β)ⁿ ≥ ρβ for the pass's β: 1 or 0, or −1
    where it takes numpy's power to know. numpy computes xⁿ as x for n = 1, x·x for n = 2,
    and with its own pow() otherwise (SIMD, within a few ulps of the C library's): the
    comparison is taken from the C library's power where every power within 8 ulps of it
    gives the same (1 − · is monotone in it).  # float, float, int -> int"""
    product = scale * beta
    computed = power(1.0 - beta, num_drafts)
    if num_drafts <= 2 or computed != computed or product != product:  # NaN compares False
        return 1 if 1.0 - computed >= product else 0
    band = 8 * EPS * abs(computed) + 8 * SMALLEST_SUBNORMAL
    if 1.0 - (computed + band) >= product:
        return 1
    if 1.0 - (computed - band) < product:
        return 0
    return -1


@compiled
def far_estimate(target_in_order, draft_in_order, target_inside, draft_inside, scale):
    """β's far form and its bound: β ≈ P_k/ρ + (Q_V − Q_k), P, Q the running sums of p and
    q in scan order and k = #{p/q < ρ}; O(log V). Off from Σ min(p/ρ, q) by
    ≤ 4(V + 4)·u·(P_V + Q_V): each running sum is within V·u of its exact value (Q twice), a
    ratio within u of ρ is on either side, the division and the sum round once each, and the
    factor 2 covers second-order terms; quotients p/ρ below the normal range add V·2⁻¹⁰⁷⁴.
    u = 2⁻⁵³.  # [vocab] x2, [vocab + 1] x2, float -> float, float"""
    index = ratios_below(target_in_order, draft_in_order, scale, False)
    beta = target_inside[index] / scale + (draft_inside[-1] - draft_inside[index])
    error = 4 * (target_in_order.size + 4) * UNIT_ROUNDOFF * (target_inside[-1] + draft_inside[-1])
    return beta, error + target_in_order.size * SMALLEST_SUBNORMAL


@compiled
def near_form(target_in_order, draft_in_order, low, high):
    """What β's near form on the bracket [low, high] keeps (``near_estimate``): (start, stop,
    S_P = Σ_{p/q < low} p, S_Q = Σ_{p/q > high} q, each summed pairwise once, and the factor
    2(A + M + 8)·u of its bound), start = #{p/q < low}, stop = #{p/q ≤ high}, M = stop − start,
    A = ``pairwise_additions`` of the longer sum; start −1 where more than ``NEAR_TOKENS``
    ratios lie inside.  # [vocab] x2, float, float -> (int, int, float, float, float)"""
    start = ratios_below(target_in_order, draft_in_order, low, False)
    stop = ratios_below(target_in_order, draft_in_order, high, True)
    if stop - start > NEAR_TOKENS:
        return -1, -1, 0.0, 0.0, 0.0
    below = pairwise_sum(target_in_order, 0, start)
    above = pairwise_sum(draft_in_order, stop, target_in_order.size)
    terms = pairwise_additions(max(start, target_in_order.size - stop)) + (stop - start) + 8
    return start, stop, below, above, 2 * terms * UNIT_ROUNDOFF


@compiled
def near_estimate(target_in_order, draft_in_order, near, scale):
    """β's near form for any ρ in the bracket ``near_form`` kept, and its bound:
    β ≈ S_P/ρ + S_Q + Σ_{low ≤ p/q ≤ high} min(p/ρ, q), the M tokens inside summed one by one,
    off by ≤ 2(A + M + 8)·u·(S_P + S_Q + Σ_inside q) + V·2⁻¹⁰⁷⁴ (quotients below the normal
    range).  # [vocab] x2, near_form's tuple, float -> float, float"""
    start, stop, below, above, relative = near
    middle, middle_draft = 0.0, 0.0
    for token in range(start, stop):
        quotient = target_in_order[token] / scale
        middle += quotient if quotient < draft_in_order[token] else draft_in_order[token]
        middle_draft += draft_in_order[token]
    error = relative * (below + above + middle_draft) + target_in_order.size * SMALLEST_SUBNORMAL
    return below / scale + above + middle, error


@compiled
def ratios_below(target_in_order, draft_in_order, scale, inclusive):
    """#{p/q < ρ} (``inclusive``: ≤ ρ) along the scan order, by bisection on p/q (ascending,
    NaN last; ``np.searchsorted`` on the ratios, left or right).  # [vocab] x2 -> int"""
    low, high = 0, target_in_order.size
    while low < high:
        middle = (low + high) // 2
        ratio = target_in_order[middle] / draft_in_order[middle]
        if ratio < scale or (inclusive and ratio == scale):
            low = middle + 1
        else:
            high = middle
    return low


@compiled
def certain(beta, error, scale, num_drafts, pass_terms, subnormal_error):
    """``_bracket_holds`` at ``scale`` when h(β) = 1 − (1 − β)ⁿ − ρβ is away from 0 by more
    than rounding can move it: 1 or 0, −1 where not settled. The pass's sum β_f is within
    E = e + (A + 2)·u·(β + e) of the estimate β (e: the estimate's bound, subnormal
    quotients included; A: additions a term meets in numpy's pairwise sum,
    ``pairwise_additions``; each term's own rounding u; the pass's subnormal quotients).
    Between β and β_f, |h'| = |n(1 − β)ⁿ⁻¹ − ρ| ≤ L = n·(|1 − β| + E)ⁿ⁻¹ + ρ, and h computed
    in floats is within e_h = (4n + 64)·u of h (1 − β, a pow() within 16 ulps, 1 − ·, ρ·β
    and the difference). So |h(β)| > L·E + 2·e_h gives h(β_f) the same sign, and the pass's
    comparison; the margin takes 2·L·E for the rounding of L and of itself.
    # float x3, int, int, float -> int"""
    error += pass_terms * UNIT_ROUNDOFF * (beta + error) + subnormal_error
    slope = num_drafts * (abs(1.0 - beta) + error) ** float(num_drafts - 1) + scale
    margin = 2.0 * slope * error + 2 * (4 * num_drafts + 64) * UNIT_ROUNDOFF
    gap = 1.0 - (1.0 - beta) ** float(num_drafts) - scale * beta
    if gap > margin:
        return 1
    if gap < -margin:
        return 0
    return -1


@compiled
def pairwise_additions(length):
    """At most how many additions a term meets in numpy's sum of ``length`` contiguous
    values (``probability.pairwise_sum``): pairwise halving (one per level, ≤ bit length)
    down to blocks of ≤ 128 summed in 8 running sums (≤ 15 + 3 + 7), plus one per chunk of
    8192 should the reduction be buffered; 32 covers the block and the slack. Its error is
    then ≤ A·u·Σ|terms| (to first order)."""
    bits = 0
    while (1 << bits) <= length:
        bits += 1
    return 32 + bits + length // 8192


def kseq_parts(target, draft, num_drafts, scale=None):
    """(ρ*, β, p_acc/β, leftover) per row: leftover = (p − (p_acc/β)·min(p/ρ*, q))+, the
    unnormalised residual. With β = 0, p_acc/β is its limit n and leftover = p. ``scale``:
    ρ* when known (``kseq_scale_of``), else ``kseq_scale``.
    # [batch, vocab] x2, scale [batch] or None -> [batch, 1] x3, [batch, vocab]"""
    xp = array_module(target)
    scale = (kseq_scale(target, draft, num_drafts) if scale is None else scale)[:, None]
    accepted_mass = xp.minimum(target / scale, draft)  # q·a
    beta = accepted_mass.sum(-1)[:, None]
    p_acc = 1.0 - (1.0 - beta) ** num_drafts
    factor = xp.where(beta > 0, p_acc / xp.where(beta > 0, beta, 1.0), float(num_drafts))
    leftover = target - factor * accepted_mass
    leftover = np.maximum(leftover, 0.0) if xp is np else leftover.clamp_min(0.0)
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
        import torch

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
        scale = kseq_scale(target, draft, num_drafts) if scale is None else scale
        target, draft = (np.ascontiguousarray(rows, dtype=np.float64) for rows in (target, draft))
        return kseq_acceptance(target, draft, np.ascontiguousarray(scale, dtype=np.float64), num_drafts)


@compiled(error_model="numpy")
def kseq_acceptance(target, draft, scale, num_drafts):
    """K-SEQ's exact acceptance per row (``KSeq``): with a = min(p/ρ*, q), β = Σ a,
    p_acc = 1 − (1 − β)ⁿ, the leftover (p − (p_acc/β)·a)+ (p_acc/β → n at β = 0) and r its
    normalisation (p where it has no mass), w = (q − a)/(1 − β) a rejected draft's law:
    α = p_acc + (1 − β)ⁿ Σ_y r(y)·(1 − (1 − w(y))ⁿ). The sums go in numpy's order
    (``probability.pairwise_sum``), so β and the leftover's mass are ``kseq_parts``'s;
    1 − (1 − w)ⁿ is w·Σ_{k<n} (1 − w)ᵏ, which has no cancellation where w is tiny
    (1 − (1 − w)ⁿ formed directly is off by u/(n·w) of itself).
    # [batch, vocab] x2, [batch] -> [batch]"""
    batch, vocab_size = target.shape
    acceptance = np.empty(batch)
    accepted, leftover = np.empty(vocab_size), np.empty(vocab_size)
    for row in range(batch):
        for token in range(vocab_size):
            quotient = target[row, token] / scale[row]
            accepted[token] = quotient if quotient < draft[row, token] else draft[row, token]
        beta = pairwise_sum(accepted, 0, vocab_size)
        none_accepted = power(1.0 - beta, num_drafts)
        factor = (1.0 - none_accepted) / beta if beta > 0 else float(num_drafts)
        for token in range(vocab_size):
            mass = target[row, token] - factor * accepted[token]
            leftover[token] = mass if mass > 0.0 else 0.0
        hits = 0.0
        if none_accepted > 0:
            total = pairwise_sum(leftover, 0, vocab_size)
            for token in range(vocab_size):
                residual = leftover[token] / total if total > 0 else target[row, token]
                rejected = (draft[row, token] - accepted[token]) / (1.0 - beta)
                kept, stays = 1.0, 1.0  # Σ_{k<n} (1 − w)^k, (1 − w)^k
                for _ in range(num_drafts - 1):
                    stays *= 1.0 - rejected
                    kept += stays
                leftover[token] = residual * rejected * kept
            hits = pairwise_sum(leftover, 0, vocab_size)
        acceptance[row] = 1.0 - none_accepted + none_accepted * hits
    return acceptance


@compiled
def power(base, exponent):
    """baseⁿ as numpy's ``**`` for n ≤ 2 (base, base·base), else the C library's pow(). # -> float"""
    if exponent == 1:
        return base
    if exponent == 2:
        return base * base
    return base ** float(exponent)
