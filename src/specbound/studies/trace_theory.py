"""Yin et al.'s expected decoding cost, evaluated along one real generation (SPEC.md §1-§2).

[YIN] Thm 1 and Thm 3 are expectations over target-distributed prefixes,
E[N_rej] = Σ_t E_{x<t ~ target}[·]. A language model's prefixes cannot be summed over, but a
generation by a lossless method *is* a target sample, so each term is estimated without
bias along it. Letters: p = target, q = draft.

``trace_expected_cost`` goes further and follows the decoding *rounds* along the trace: for
each position t it keeps ψ_t(s) = P(the round covering position t started at position s |
x<t), the conditional law of the round state given the text so far, and sums
e_t = E[rejection at t | x<t]. With a round started at s drafting d(s) tokens (its depth;
M i.i.d. drafts at the root, one chain after it, [YIN] Alg. 4), position t = s + k is
- the root (k = 0 < d): all M root drafts rejected with probability Π_m r_m (r_m = TV(p^m, q)
  on the residual chain, ``chains.theory.unaccepted_root_mass``);
- a drafted position (0 < k < d): rejected with probability TV(p_t, q_t);
- the bonus (k = d): sampled from p, never rejected.
The realised token y = x_t then updates ψ by Bayes: from a root the next position starts a
new round with joint weight U_t(y) (the unaccepted root mass at y) and continues with
p_t(y) − U_t(y); from a drafted position (p − q)+(y) and min(p, q)(y); a bonus always ends
the round, weight p_t(y); dividing by p_t(y) conditions on y. This is the forward pass of
``chains.theory.lookahead_expected_cost`` restricted to one trace, so Σ_t e_t is an unbiased
estimate of E[N_rej] and Σ_t ψ_t(t) one of E[target calls]; summed over all traces weighted
by their probability it *equals* the chain-theory value (tested by enumeration).

Depth of a round started at s, horizon T, lookahead γ (None: K = ∞):
- ``last_token_bonus=True`` (the engine, ``specbound.engine.Decoder``): d = min(γ, T − s − 1),
  so the horizon's last token can be a bonus;
- ``last_token_bonus=False`` (``chains.theory``, [YIN]): d = min(γ, T − s); with K = ∞ every
  position is verified and Σ_t e_t is Thm 3 along the trace (Thm 1 for M = 1: Σ_t TV_t).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specbound.chains.theory import check_lookahead, check_num_drafts, unaccepted_root_mass
from specbound.probability import as_target_and_draft


@dataclass(frozen=True)
class TraceCost:
    expected_rejection: np.ndarray  # [T] e_t = E[rejection at t | x<t]
    round_start: np.ndarray  # [T] ψ_t(t) = P(a round starts at t | x<t)

    @property
    def rejections(self) -> float:
        """Σ_t e_t: unbiased estimate of E[N_rej]."""
        return float(self.expected_rejection.sum())

    @property
    def target_calls(self) -> float:
        """Σ_t ψ_t(t): unbiased estimate of E[rounds] (one target call each)."""
        return float(self.round_start.sum())


def trace_expected_cost(
    target_rows, draft_rows, tokens, num_drafts: int = 1, lookahead: int | None = None,
    last_token_bonus: bool = True,
) -> TraceCost:
    """Expected rejections and target calls along a trace (see the module docstring).

    A token with p_t(y) = 0 in the rows (possible only through rounding differences between
    the engine's logits and the rows', e.g. at a top-p boundary) cannot condition ψ; there
    the round state moves by its average over tokens instead.
    # target_rows, draft_rows [T, vocab], tokens [T] -> TraceCost
    """
    check_num_drafts(num_drafts)
    check_lookahead(lookahead)
    target, draft = as_target_and_draft(target_rows, draft_rows)
    tokens = np.asarray(tokens)
    horizon = target.shape[0]
    if tokens.shape != (horizon,) or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"tokens: expected {horizon} integer token ids, got shape {tokens.shape}")
    if tokens.min() < 0 or tokens.max() >= target.shape[1]:
        raise ValueError(f"tokens: ids must lie in [0, {target.shape[1]})")
    rows = np.arange(horizon)
    unaccepted = unaccepted_root_mass(target, draft, num_drafts)  # U_t, [T, V]
    excess = np.maximum(target - draft, 0.0)  # (p − q)+, [T, V]
    root_rejection = unaccepted.sum(axis=1)  # Π_m r_m, [T]
    drafted_rejection = excess.sum(axis=1)  # TV, [T]
    at_token = {  # joint weights at the realised token, [T] each
        "target": target[rows, tokens],
        "unaccepted": unaccepted[rows, tokens],
        "excess": excess[rows, tokens],
    }
    span = horizon if lookahead is None else lookahead
    reserve = 1 if last_token_bonus else 0
    depth = np.minimum(span, horizon - np.arange(horizon) - reserve)  # d(s), [T]

    state = np.zeros(horizon + 1)  # ψ_t(s) for s = 0..t
    state[0] = 1.0
    expected_rejection = np.zeros(horizon)
    round_start = np.zeros(horizon)
    for t in range(horizon):
        starts = np.arange(t + 1)
        offset = t - starts
        weights = state[: t + 1]
        root = (offset == 0) & (depth[starts] > 0)
        drafted = (offset > 0) & (offset < depth[starts])
        bonus = offset == depth[starts]
        round_start[t] = state[t]
        expected_rejection[t] = weights[root].sum() * root_rejection[t] + weights[drafted].sum() * drafted_rejection[t]
        if at_token["target"][t] > 0:
            probability = at_token["target"][t]
            stop_root, stop_drafted = at_token["unaccepted"][t], at_token["excess"][t]
        else:
            probability, stop_root, stop_drafted = 1.0, root_rejection[t], drafted_rejection[t]
        ends = (
            weights[root].sum() * stop_root
            + weights[drafted].sum() * stop_drafted
            + weights[bonus].sum() * probability
        )
        following = np.zeros(horizon + 1)
        following[: t + 1] = np.where(root, weights * (probability - stop_root), 0.0)
        following[: t + 1] += np.where(drafted, weights * (probability - stop_drafted), 0.0)
        following[t + 1] = ends
        state = following / probability
    return TraceCost(expected_rejection, round_start)
