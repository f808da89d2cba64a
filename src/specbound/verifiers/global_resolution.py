"""Global Resolution [GR]: the optimal verifier of n i.i.d. drafts, at any vocabulary size
(SPEC.md §4.5). Letters: p = target, q = draft (SPEC.md §0).

Only the set S of distinct drafts matters, and the coupling LP is a flow from S to the
token emitted: a token x can be accepted with mass y(x) ≤ p(x) exactly when y(A) ≤
f(A) = P(S ∩ A ≠ ∅) = 1 − (1 − q(A))ⁿ for every set A (a polymatroid). In the scan
order (p/q ascending, ``bounds.subset.scan_order``), with gap_i = p(H_i) − q(H_i)ⁿ on the
prefixes H_i and M_i = min_{j ≥ i} gap_j, the *accepted mass*

  y_i = p_i − (M_{i+1} − M_i)

is such a vector and sums to 1 + M_0 = α* (``resolution_plan``; a running minimum, no
iterative solve). It is realised by giving every draft a *rank*: the draft of the token at
scan position i holds a uniform place in the slot [q(H_i), q(H_{i+1})] — its own slot, or
the slot of a partner it exchanged length with — and the draft of the highest rank wins.
One draft's rank is uniform on [0, 1], so the winner's rank has density n·τⁿ⁻¹ and a slot
weighs w_i = q(H_{i+1})ⁿ − q(H_i)ⁿ. Each token j that holds more than it accepts (a donor,
w_j > y_j) swaps length with the tokens after it that hold less (receivers), first come
first served, inside the blocks that the strict decreases of M close. The winner x is
emitted with probability ŷ(x)/z(x), z the weight it realised and ŷ = min(y, z) ≤ min(p, z);
otherwise the token comes from norm(p − ŷ).

Whatever the exchanges achieve, the emitted law is p: each token is emitted through
acceptance with mass exactly ŷ and through the residual with the rest. Acceptance is Σ ŷ,
α* up to rounding (SPEC.md §4.5 proves both).
"""

from __future__ import annotations

import numpy as np

from specbound.bounds.rows import RowPairs
from specbound.bounds.subset import scan_order
from specbound.compiled import compiled
from specbound.probability import sample_from
from specbound.verifiers.base import Verifier, register_verifier, residual_law


class ResolutionPlan:
    """One row's plan in scan order: the accepted mass ŷ = min(y, z), the realised weight z,
    the length each token keeps of its own slot, and the exchanges (donor, receiver, length)
    with each position's range of them.
    # arrays [vocab], exchanges [count], ranges [vocab, 2]"""

    def __init__(self, order, target_row, draft_row, num_drafts):
        self.order = order  # [vocab] token id at each scan position
        (self.accepted, self.realised, self.own, self.donor, self.receiver, self.length, self.as_donor,
         self.as_receiver) = resolution_plan(
            np.ascontiguousarray(target_row[order]), np.ascontiguousarray(draft_row[order]), num_drafts)
        self.position = np.empty_like(order)
        self.position[order] = np.arange(order.size)

    def leftover(self, target_row):
        """p − ŷ in token-id order (clipped at 0 against rounding), the unnormalised residual.  # [vocab]"""
        leftover = np.empty_like(target_row)
        leftover[self.order] = np.maximum(target_row[self.order] - self.accepted, 0.0)
        return leftover

    def pieces(self, position):
        """(slots, lengths) the draft of the token at ``position`` is placed in: its own slot
        first, then its partners' slots, in exchange order.  # -> [pieces] int, [pieces]"""
        donated, received = slice(*self.as_donor[position]), slice(*self.as_receiver[position])
        slots = np.concatenate([[position], self.receiver[donated], self.donor[received]]).astype(np.int64)
        return slots, np.concatenate([[self.own[position]], self.length[donated], self.length[received]])


@compiled(error_model="numpy")
def resolution_plan(target, draft, num_drafts):
    """The plan of one row given in scan order (module docstring): accepted ŷ, realised z and
    own length [vocab]; exchanges donor, receiver, length [count]; per position the ranges
    [first, stop) of its exchanges as donor and as receiver [vocab, 2]. Slot i spans
    [q(H_i), q(H_i+1)] and has mass q_i; its value ω_i, the mean of n·τⁿ⁻¹ over it, is
    Σ_{a<n} hiᵃ·loⁿ⁻¹⁻ᵃ, which does not cancel for a short slot.
    # [vocab] x2, int -> tuple of arrays"""
    size = target.size
    bounds, target_inside = np.empty(size + 1), np.empty(size + 1)
    bounds[0] = target_inside[0] = 0.0
    for i in range(size):
        bounds[i + 1] = bounds[i] + draft[i]
        target_inside[i + 1] = target_inside[i] + target[i]
    least = np.empty(size + 1)  # M_i = min_{j ≥ i} gap_j
    for i in range(size, -1, -1):
        power = bounds[i]
        for _ in range(num_drafts - 1):
            power *= bounds[i]
        gap = target_inside[i] - power
        least[i] = gap if i == size or gap < least[i + 1] else least[i + 1]
    accepted = np.empty(size)
    values, own = np.empty(size), np.empty(size)
    for i in range(size):
        accepted[i] = max(0.0, target[i] - (least[i + 1] - least[i]))
        low, high = bounds[i], bounds[i + 1]
        value, power = 1.0, 1.0  # Horner: v_k = v_(k-1)·lo + hiᵏ gives Σ_{a<n} hiᵃ·loⁿ⁻¹⁻ᵃ
        for _ in range(num_drafts - 1):
            power *= high
            value = value * low + power
        values[i] = value
        own[i] = draft[i]  # the slot's mass: q_i, exact where its float bounds round it away
    donor = np.empty(2 * size + 1, dtype=np.int64)
    receiver = np.empty(2 * size + 1, dtype=np.int64)
    length = np.empty(2 * size + 1)
    queue, slack = np.empty(size, dtype=np.int64), np.empty(size)
    as_donor = np.zeros((size, 2), dtype=np.int64)  # [first, stop) of each position's exchanges
    as_receiver = np.zeros((size, 2), dtype=np.int64)
    head = tail = count = 0
    for i in range(size - 1, -1, -1):  # from the highest rank down
        spare = own[i] * values[i] - accepted[i]
        if spare > 0:
            queue[tail], slack[tail] = i, spare
            tail += 1
        needed = -spare
        as_receiver[i, 0] = count
        while needed > 0 and head < tail and own[i] > 0:
            j = queue[head]
            step = values[j] - values[i]
            if step <= 0:  # only rounding: no donor ahead of i ranks above it
                break
            wanted = min(needed, slack[head])
            swapped = min(wanted / step, own[i], own[j])
            if swapped <= 0:  # nothing left to swap (rounding): the next donor
                head += 1
                continue
            moved = wanted if swapped == wanted / step else swapped * step
            donor[count], receiver[count], length[count] = j, i, swapped
            if as_donor[j, 1] == 0:  # a donor's exchanges follow one another: it leaves the queue after them
                as_donor[j, 0] = count
            count += 1
            as_donor[j, 1] = count
            own[i] -= swapped
            own[j] -= swapped
            slack[head] -= moved
            needed -= moved
            if slack[head] <= 0 or own[j] <= 0:
                head += 1
        as_receiver[i, 1] = count
        if least[i] < least[i + 1]:  # a strict decrease of M closes the block
            head = tail
    realised = own * values
    for e in range(count):
        realised[donor[e]] += length[e] * values[receiver[e]]
        realised[receiver[e]] += length[e] * values[donor[e]]
    for i in range(size):
        accepted[i] = min(accepted[i], realised[i])
    return (accepted, realised, own, donor[:count].copy(), receiver[:count].copy(), length[:count].copy(),
            as_donor, as_receiver)


def _place(plan, position, uniform):
    """The rank of a draft of the token at ``position`` from one uniform: (slot, place in
    it), compared lexicographically (inverse CDF over its pieces).  # -> (int, float)"""
    slots, lengths = plan.pieces(position)
    ends = np.cumsum(lengths)
    mass = uniform * ends[-1]
    piece = int(np.searchsorted(ends, mass, side="right"))  # ends[piece - 1] ≤ mass < ends[piece]
    if piece == len(ends):  # a uniform within rounding of 1
        piece = int(np.flatnonzero(lengths > 0)[-1])
        return int(slots[piece]), np.nextafter(1.0, 0.0)
    return int(slots[piece]), (mass - (ends[piece - 1] if piece else 0.0)) / lengths[piece]


def winning_laws(plan, positions):
    """P(the draft of the highest rank is each draft), by exact integration: on the rank axis
    (slot s at [s, s + 1)) each draft's CDF is piecewise linear, so on each slot the winner's
    density is a polynomial of degree n − 1, integrated by Gauss–Legendre with n nodes.
    # positions [n] -> [n] (summing to 1)"""
    count = len(positions)
    nodes, weights = np.polynomial.legendre.leggauss(count)
    nodes, weights = (nodes + 1) / 2, weights / 2
    pieces = [plan.pieces(p) for p in positions]
    slots = np.unique(np.concatenate([s[l > 0] for s, l in pieces]))
    mass = np.zeros((count, slots.size))  # the probability a draft lies in each slot
    for i, (s, lengths) in enumerate(pieces):
        total = lengths.sum()
        np.add.at(mass[i], np.searchsorted(slots, s[lengths > 0]), lengths[lengths > 0] / total)
    below = np.cumsum(mass, axis=1) - mass  # CDF at each slot's start
    laws = np.zeros(count)
    for k in range(slots.size):
        cdf = below[:, k, None] + mass[:, k, None] * nodes[None, :]  # [n, nodes]
        for i in range(count):
            others = np.prod(np.delete(cdf, i, axis=0), axis=0)
            laws[i] += mass[i, k] * np.dot(weights, others)
    return laws


@register_verifier
class GlobalResolution(Verifier):
    """The optimal verifier of i.i.d. drafts (module docstring); α = α* with replacement."""

    name = "global_resolution"
    label = "Global Resolution (i.i.d., optimal)"
    scheme = "with_replacement"  # attains_optimum stays False: Σ min(p, z) is computed, α* up to rounding

    def _plans(self, target, draft, num_drafts):
        return [ResolutionPlan(o, t, d, num_drafts) for o, t, d in zip(scan_order(target, draft), target, draft)]

    def _verify(self, target, draft, tokens, uniforms):
        emitted = np.empty(tokens.shape[0], dtype=np.int64)
        for row, plan in enumerate(self._plans(target, draft, tokens.shape[1])):
            positions = plan.position[tokens[row]]
            ranks = [_place(plan, p, u) for p, u in zip(positions, uniforms[row, :-1])]
            winner = positions[max(range(len(ranks)), key=ranks.__getitem__)]
            keep = plan.accepted[winner] / plan.realised[winner] if plan.realised[winner] > 0 else 0.0
            uniform = uniforms[row, -1]
            if uniform < keep:
                emitted[row] = plan.order[winner]
                continue
            leftover = plan.leftover(target[row])
            rescaled = min((uniform - keep) / (1.0 - keep), np.nextafter(1.0, 0.0))
            emitted[row] = sample_from(residual_law(leftover[None], target[row, None]), np.array([rescaled]))[0]
        return emitted

    def _output_law(self, target, draft, tokens):
        laws = np.zeros_like(target)
        for row, plan in enumerate(self._plans(target, draft, tokens.shape[1])):
            positions = plan.position[tokens[row]]
            wins = winning_laws(plan, positions)
            kept = 0.0
            for position, win in zip(positions, wins):
                if plan.realised[position] > 0:
                    share = win * plan.accepted[position] / plan.realised[position]
                    laws[row, plan.order[position]] += share
                    kept += share
            if kept < 1.0:
                leftover = plan.leftover(target[row])
                laws[row] += (1.0 - kept) * residual_law(leftover[None], target[row, None])[0]
        return laws

    def acceptance_rate_of(self, rows: RowPairs, num_drafts: int) -> np.ndarray:
        """``acceptance_rate`` of checked rows, from the rows they hold in scan order.  # -> [batch]"""
        self.check_num_drafts(num_drafts, support=rows.support)
        return _accepted_totals(rows.target_in_scan_order, rows.draft_in_scan_order, num_drafts)

    def _acceptance_rate(self, target, draft, num_drafts):
        order = scan_order(target, draft)
        return _accepted_totals(np.take_along_axis(target, order, axis=1), np.take_along_axis(draft, order, axis=1),
                                num_drafts)


def _accepted_totals(target_in_order, draft_in_order, num_drafts):
    """Σ min(y, z) of each row's plan, the rows given in scan order.  # [batch, vocab] x2 -> [batch]"""
    rows = (np.ascontiguousarray(rows, dtype=np.float64) for rows in (target_in_order, draft_in_order))
    return np.array([resolution_plan(t, d, num_drafts)[0].sum() for t, d in zip(*rows)])
