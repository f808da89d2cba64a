"""Trading bias for fewer rejections [YIN §4, Thm 4, Thm 5] (SPEC.md §3): the Pareto front
and the ε-biased verifiers Decoding-OPT and Decoding-UNO.

Letters follow SPEC.md §0: p = target, q = draft. One token; an algorithm is a pair (b, R):
accept the draft x ~ q with probability b(x), otherwise emit a token from the resampling
law R. Its marginal output law is O = b·q + R·Σ(1 − b)q, its rejection probability
1 − Σ b·q and its bias TV(O, p). For a fixed acceptance vector b the least bias over all R
is

    Loss*(b) = ½ Σ|p − b·q| − ½ Σ(1 − b)·q = Σ max(0, b·q − p),

attained by R = norm((p − b·q)+), which lives on the optimal resampling set {p ≥ b·q}
[YIN Thm 4]. Hence P(reject) + Loss*(b) = 1 − Σ min(b·q, p) ≥ TV(p, q), with equality
exactly when b ≥ min(1, p/q) wherever p > 0: the Pareto front is the line from
(bias 0, rejection TV) — speculative sampling — to (bias TV, rejection 0) — always accept
[YIN Thm 5]. Decoding-OPT and Decoding-UNO both use b = min(1, (p + ε)/q); OPT's R is
optimal, so it moves along the front as ε grows.

Words: ``Verifier.output_law`` is the conditional law π(·|x) given the draft;
``marginal_output_law`` here is O, averaged over the draft x ~ q.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specbound.checks import finite_number
from specbound.probability import as_target_and_draft, sample_from, sample_from_torch, take, total_variation
from specbound.verifiers.base import Verifier, acceptance_ratio, get_verifier, register_verifier, residual_law


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
    """P(reject) = 1 − Σ b·q, summed as Σ (1 − b)·q.  # [batch, vocab] x3 -> [batch]"""
    _, draft, weights = _checked(target_probs, draft_probs, acceptance)
    return ((1.0 - weights) * draft).sum(axis=1)


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


def marginal_output_law(target_probs, draft_probs, acceptance, resampling_probs) -> np.ndarray:
    """O = b·q + R·Σ(1 − b)q.  # [batch, vocab] x4 -> [batch, vocab]"""
    _, draft, weights = _checked(target_probs, draft_probs, acceptance)
    _, resampling = as_target_and_draft(target_probs, resampling_probs)
    rejected = ((1.0 - weights) * draft).sum(axis=1, keepdims=True)
    return weights * draft + rejected * resampling


def bias(target_probs, draft_probs, acceptance, resampling_probs) -> np.ndarray:
    """TV(O, p) of the algorithm (b, R).  # -> [batch]"""
    target, _ = as_target_and_draft(target_probs, draft_probs)
    output = marginal_output_law(target_probs, draft_probs, acceptance, resampling_probs)
    return total_variation(output, target)


def front_acceptance(target_probs, draft_probs, fraction: float) -> np.ndarray:
    """b_λ = min(1, p/q) + λ(1 − min(1, p/q)), λ ∈ [0, 1]: from speculative sampling (λ = 0)
    to always accepting (λ = 1); every b_λ lies on the Pareto front.  # -> [batch, vocab]"""
    finite_number("fraction", fraction, 0.0, 1.0)
    target, draft = as_target_and_draft(target_probs, draft_probs)
    with np.errstate(divide="ignore", invalid="ignore"):
        lossless = np.where(draft > 0, np.minimum(1.0, target / draft), 1.0)
    return lossless + fraction * (1.0 - lossless)


@dataclass(frozen=True)
class BiasedDecoding(Verifier):
    """Accept the draft x with b(x) = min(1, (p(x) + ε)/q(x)), else emit from a resampling
    law R. Not lossless for ε > 0: the output law is O = b·q + R·Σ(1 − b)q and its bias is
    TV(O, p) (module docstring). ``rejection_rate`` = 1 − Σ b·q is the rate at which the
    draft test fails; ``acceptance_rate`` is P(y = x), which also counts a resample equal
    to x. The numpy reference (``_verify``) and the engine's torch path (``_verify_torch``)
    consume the same uniforms: column 0 tests the draft, the last one resamples."""

    scheme = "with_replacement"
    lossless = False
    fixed_num_drafts = 1
    epsilon: float = 0.0

    def __post_init__(self):
        if isinstance(self.epsilon, bool) or not (np.isfinite(self.epsilon) and self.epsilon >= 0):
            raise ValueError(f"epsilon: must be a finite number >= 0, got {self.epsilon!r}")

    def acceptance_weights(self, target, draft) -> np.ndarray:
        """b = min(1, (p + ε)/q) where q > 0 (1 elsewhere).  # [batch, vocab]"""
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return np.where(draft > 0, np.minimum(1.0, (target + self.epsilon) / draft), 1.0)

    def draft_acceptance(self, target_mass, draft_mass):
        """b(x) at the drafted tokens, whose q(x) > 0, numpy or torch; (p + ε)/q overflows to
        inf for a subnormal q, where b = 1.  # [batch] x2 -> [batch]"""
        with np.errstate(over="ignore"):
            return acceptance_ratio(target_mass + self.epsilon, draft_mass)

    def resampling_law(self, target, draft):
        """R, numpy or torch.  # [batch, vocab] x2 -> [batch, vocab]"""
        raise NotImplementedError

    def _resampling_where_rejecting(self, target, draft, weights) -> np.ndarray:
        """R on the rows that can reject; the target row elsewhere (never used: weight 0)."""
        live = ((1.0 - weights) * draft).sum(axis=1) > 0
        law = target.copy()
        if np.any(live):
            law[live] = self.resampling_law(target[live], draft[live])
        return law

    def _verify(self, target, draft, tokens, uniforms):
        draft_token = tokens[:, 0]
        accept = self.draft_acceptance(take(target, draft_token), take(draft, draft_token))
        emitted = draft_token.copy()
        rejected = uniforms[:, 0] >= accept
        if np.any(rejected):
            emitted[rejected] = sample_from(
                self.resampling_law(target[rejected], draft[rejected]), uniforms[rejected, -1]
            )
        return emitted

    def _verify_torch(self, target, draft, tokens, uniforms):
        """``_verify`` on torch tensors; R is built only when some row rejects (one sync).
        # target, draft [batch, vocab], tokens [batch, 1], uniforms [batch, 2] -> [batch]"""
        draft_token = tokens[:, 0]
        accept = self.draft_acceptance(target.gather(1, tokens)[:, 0], draft.gather(1, tokens)[:, 0])
        rejected = uniforms[:, 0] >= accept
        if not bool(rejected.any()):
            return draft_token
        import torch

        resampled = sample_from_torch(self.resampling_law(target, draft), uniforms[:, -1], rejected)
        return torch.where(rejected, resampled, draft_token)

    def _output_law(self, target, draft, tokens):
        draft_token = tokens[:, 0]
        accept = self.draft_acceptance(take(target, draft_token), take(draft, draft_token))
        law = np.zeros_like(target)
        np.put_along_axis(law, draft_token[:, None], accept[:, None], axis=1)
        live = accept < 1
        law[live] += (1.0 - accept[live, None]) * self.resampling_law(target[live], draft[live])
        return law

    def output_distribution(self, target_probs, draft_probs) -> np.ndarray:
        """Exact marginal output law O = b·q + R·Σ(1 − b)q.  # -> [batch, vocab]"""
        target, draft, _ = self._check(target_probs, draft_probs, num_drafts=1)
        weights = self.acceptance_weights(target, draft)
        return marginal_output_law(target, draft, weights, self._resampling_where_rejecting(target, draft, weights))

    def rejection_rate(self, target_probs, draft_probs) -> np.ndarray:
        """P(the draft test fails) = 1 − Σ b·q.  # -> [batch]"""
        target, draft, _ = self._check(target_probs, draft_probs, num_drafts=1)
        return rejection_probability(target, draft, self.acceptance_weights(target, draft))

    def bias(self, target_probs, draft_probs) -> np.ndarray:
        """Exact TV(O, p) per row.  # -> [batch]"""
        target, _ = as_target_and_draft(target_probs, draft_probs)
        return total_variation(self.output_distribution(target_probs, draft_probs), target)

    def _acceptance_rate(self, target, draft, num_drafts):
        """P(y = x) = Σ_x q(x)·[b(x) + (1 − b(x))·R(x)]."""
        weights = self.acceptance_weights(target, draft)
        resampling = self._resampling_where_rejecting(target, draft, weights)
        return (weights * draft).sum(axis=1) + ((1.0 - weights) * draft * resampling).sum(axis=1)


@register_verifier
@dataclass(frozen=True)
class DecodingOPT(BiasedDecoding):
    """Decoding-OPT [YIN §4, Thm 5]: R = norm((p − q)+), the optimal resampling law for
    this b; its bias equals Loss*(b) and P(reject) + bias = TV(p, q). Where (p − q)+ has no
    mass the rows agree up to rounding and R = p (``residual_law``)."""

    name = "decoding_opt"
    label = "Decoding-OPT (R = norm((p − q)+))"

    def resampling_law(self, target, draft):
        return residual_law((target - draft).clip(min=0.0), target)


@register_verifier
@dataclass(frozen=True)
class DecodingUNO(BiasedDecoding):
    """Decoding-UNO [YIN §4]: same b, resamples from the target p (the paper's text), or
    from the draft q with ``resample="draft"`` (the paper's printed code)."""

    name = "decoding_uno"
    resample: str = "target"

    def __post_init__(self):
        super().__post_init__()
        if self.resample not in ("target", "draft"):
            raise ValueError(f"resample: expected 'target' or 'draft', got {self.resample!r}")

    @property
    def label(self) -> str:  # type: ignore[override]
        return "Decoding-UNO (R = p, paper's text)" if self.resample == "target" else "Decoding-UNO (R = q, paper's code)"

    def resampling_law(self, target, draft):
        return target if self.resample == "target" else draft


@dataclass(frozen=True)
class SweepPoint:
    """One algorithm on the (bias, rejection) plane, for one (target, draft) row."""

    method: str  # a key of SWEEP_METHODS
    epsilon: float
    rejection: float  # 1 − Σ b·q
    bias: float  # TV(O, p) with the method's R
    least_bias: float  # Loss*(b): the best any R can do with this b


SWEEP_METHODS = {  # name -> (verifier, its parameters)
    "decoding_opt": ("decoding_opt", {}),
    "decoding_uno": ("decoding_uno", {"resample": "target"}),
    "decoding_uno_draft": ("decoding_uno", {"resample": "draft"}),
}


def sweep_verifier(method: str, epsilon: float) -> BiasedDecoding:
    """The biased verifier of a sweep method (``SWEEP_METHODS``) at ε."""
    if method not in SWEEP_METHODS:
        raise ValueError(f"method: unknown method {method!r}; choose one of {sorted(SWEEP_METHODS)}")
    name, parameters = SWEEP_METHODS[method]
    return get_verifier(name, epsilon=float(epsilon), **parameters)


def epsilon_sweep(target_probs, draft_probs, epsilons, method: str = "decoding_opt") -> list[SweepPoint]:
    """Decoding-OPT / Decoding-UNO for each ε, on one (target, draft) pair.

    b = min(1, (p + ε)/q) for both; OPT resamples from norm((p − q)+) (its bias = Loss*(b),
    on the front), UNO from p as in [YIN]'s text, or from q (``decoding_uno_draft``, as in its
    printed code).
    """
    sweep_verifier(method, 0.0)
    target, draft = as_target_and_draft(target_probs, draft_probs)
    if target.shape[0] != 1:
        raise ValueError(f"target_probs: epsilon_sweep takes one row, got {target.shape[0]}")
    points = []
    for epsilon in epsilons:
        verifier = sweep_verifier(method, epsilon)
        weights = verifier.acceptance_weights(target, draft)
        points.append(SweepPoint(
            method=method,
            epsilon=float(epsilon),
            rejection=float(verifier.rejection_rate(target, draft)[0]),
            bias=float(verifier.bias(target, draft)[0]),
            least_bias=float(loss_star(target, draft, weights)[0]),
        ))
    return points
