"""Trading bias for fewer rejections: Loss*(b) and the Pareto front [YIN §4, Thm 4, Thm 5].

Letters follow SPEC §0: p = target, q = draft. One token; an algorithm is a pair (b, R):
accept the draft x ~ q with probability b(x), otherwise emit a token from the resampling law
R. Its output law is O = b·q + R·Σ(1 − b)q, its rejection probability 1 − Σ b·q and its bias
TV(O, p). For a fixed acceptance vector b the least bias over all R is

    Loss*(b) = ½ Σ|p − b·q| − ½ Σ(1 − b)·q = Σ max(0, b·q − p),

attained by R = norm((p − b·q)+), which lives on the optimal resampling set {p ≥ b·q}
[YIN Thm 4]. Hence P(reject) + Loss*(b) = 1 − Σ min(b·q, p) ≥ TV(p, q), with equality
exactly when b ≥ min(1, p/q) wherever p > 0: the Pareto front is the line from
(bias 0, rejection TV) — speculative sampling — to (bias TV, rejection 0) — always accept
[YIN Thm 5]. Decoding-OPT and Decoding-UNO (``specbound.verifiers``) both use
b = min(1, (p + ε)/q); OPT's R is optimal, so it moves along the front as ε grows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specbound.probability import as_target_and_draft, total_variation
from specbound.verifiers import get_verifier


def _checked(target_probs, draft_probs, acceptance):
    """Checked (target, draft, b), all ``[batch, vocab]``; a single row broadcasts against a
    batch of the others. Raises ValueError unless b has a matching shape and lies in [0, 1]."""
    target, draft = as_target_and_draft(target_probs, draft_probs)
    weights = np.asarray(acceptance, dtype=np.float64)
    if weights.ndim == 1:
        weights = weights[None, :]
    try:
        shape = np.broadcast_shapes(target.shape, weights.shape)
    except ValueError:
        shape = None
    if shape is None or len(shape) != 2:
        raise ValueError(
            f"acceptance: shape {np.shape(acceptance)} does not match the distributions' "
            f"{target.shape}"
        )
    if not np.all(np.isfinite(weights)) or np.any(weights < 0) or np.any(weights > 1):
        raise ValueError("acceptance: every acceptance probability b(x) must lie in [0, 1]")
    return tuple(np.broadcast_to(array, shape) for array in (target, draft, weights))


def rejection_probability(target_probs, draft_probs, acceptance) -> np.ndarray:
    """P(reject) = 1 − Σ b·q.  # [batch, vocab] x3 -> [batch]"""
    _, draft, weights = _checked(target_probs, draft_probs, acceptance)
    return 1.0 - (weights * draft).sum(axis=1)


def loss_star(target_probs, draft_probs, acceptance) -> np.ndarray:
    """Loss*(b) = min_R TV(O, p) = ½Σ|p − b·q| − ½Σ(1 − b)·q [YIN Thm 4].  # -> [batch]"""
    target, draft, weights = _checked(target_probs, draft_probs, acceptance)
    accepted = weights * draft
    return 0.5 * np.abs(target - accepted).sum(axis=1) - 0.5 * (draft - accepted).sum(axis=1)


def optimal_resampling_set(target_probs, draft_probs, acceptance) -> np.ndarray:
    """Tokens where an optimal R may put mass: A = (p − b·q)/Σ(1 − b)q ≥ 0, i.e. p ≥ b·q.
    Any R with R = 0 off this set and R ≤ A on it attains Loss*(b).  # -> [batch, vocab] bool"""
    target, draft, weights = _checked(target_probs, draft_probs, acceptance)
    return target >= weights * draft


def optimal_resampling_law(target_probs, draft_probs, acceptance) -> np.ndarray:
    """R* = norm((p − b·q)+), an optimal resampling law (R* ≤ A since Σ A⁺ ≥ 1).

    A row with (p − b·q)+ = 0 has b·q = p, never rejects, and needs no R; the target row is
    returned there.  # -> [batch, vocab]
    """
    target, draft, weights = _checked(target_probs, draft_probs, acceptance)
    excess = np.maximum(target - weights * draft, 0.0)
    totals = excess.sum(axis=1, keepdims=True)
    return np.where(totals > 0, excess / np.where(totals > 0, totals, 1.0), target)


def output_law(target_probs, draft_probs, acceptance, resampling_probs) -> np.ndarray:
    """O = b·q + R·Σ(1 − b)q.  # [batch, vocab] x4 -> [batch, vocab]"""
    _, draft, weights = _checked(target_probs, draft_probs, acceptance)
    _, resampling = as_target_and_draft(target_probs, resampling_probs)
    rejected = ((1.0 - weights) * draft).sum(axis=1, keepdims=True)
    return weights * draft + rejected * resampling


def bias(target_probs, draft_probs, acceptance, resampling_probs) -> np.ndarray:
    """TV(O, p) of the algorithm (b, R).  # -> [batch]"""
    target, _ = as_target_and_draft(target_probs, draft_probs)
    output = output_law(target_probs, draft_probs, acceptance, resampling_probs)
    return total_variation(output, target)


def front_acceptance(target_probs, draft_probs, fraction: float) -> np.ndarray:
    """b_λ = min(1, p/q) + λ(1 − min(1, p/q)), λ ∈ [0, 1]: from speculative sampling (λ = 0)
    to always accepting (λ = 1); every b_λ lies on the Pareto front.  # -> [batch, vocab]"""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction: must lie in [0, 1], got {fraction}")
    target, draft = as_target_and_draft(target_probs, draft_probs)
    with np.errstate(divide="ignore", invalid="ignore"):
        lossless = np.where(draft > 0, np.minimum(1.0, target / draft), 1.0)
    return lossless + fraction * (1.0 - lossless)


@dataclass(frozen=True)
class SweepPoint:
    """One algorithm on the (bias, rejection) plane, for one (target, draft) row."""

    method: str  # "decoding_opt", "decoding_uno" (R = p) or "decoding_uno_draft" (R = q)
    epsilon: float
    rejection: float  # 1 − Σ b·q
    bias: float  # TV(O, p) with the method's R
    least_bias: float  # Loss*(b): the best any R can do with this b


SWEEP_METHODS = {
    "decoding_opt": {},
    "decoding_uno": {"resample": "target"},
    "decoding_uno_draft": {"resample": "draft"},
}


def epsilon_sweep(target_probs, draft_probs, epsilons, method: str = "decoding_opt"):
    """Decoding-OPT / Decoding-UNO for each ε, on one (target, draft) pair: list[SweepPoint].

    b = min(1, (p + ε)/q) for both; OPT resamples from norm((p − q)+) (its bias = Loss*(b),
    on the front), UNO from p as in [YIN]'s text, or from q (``decoding_uno_draft``, as in its
    printed code).
    """
    if method not in SWEEP_METHODS:
        raise ValueError(
            f"method: unknown method {method!r}; choose one of {sorted(SWEEP_METHODS)}"
        )
    target, draft = as_target_and_draft(target_probs, draft_probs)
    if target.shape[0] != 1:
        raise ValueError(f"target_probs: epsilon_sweep takes one row, got {target.shape[0]}")
    verifier_name = method.removesuffix("_draft")
    points = []
    for epsilon in epsilons:
        verifier = get_verifier(verifier_name, epsilon=float(epsilon), **SWEEP_METHODS[method])
        weights = verifier.acceptance_weights(target, draft)
        points.append(
            SweepPoint(
                method=method,
                epsilon=float(epsilon),
                rejection=float(verifier.rejection_rate(target, draft)[0]),
                bias=float(verifier.bias(target, draft)[0]),
                least_bias=float(loss_star(target, draft, weights)[0]),
            )
        )
    return points
