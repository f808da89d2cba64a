"""Single-step verifiers of speculative decoding, one registry looked up by name.

Vocabulary (SPEC §0): the draft side proposes n tokens x̄ = (x1..xn) from a joint law D
(the verifier's draft scheme); the verifier outputs one token y with law π(y | x̄). The
step is *accepted* when y ∈ x̄ (a residual sample that equals a draft counts), and the
verifier is *lossless* when Σ_x̄ D(x̄) π(·|x̄) = p. p = target, q = draft throughout.

Every verifier offers, batched over rows (``[batch, vocab]`` probabilities):
- ``verify(target, draft, draft_tokens, rng)``: run the algorithm, return a Verdict;
- ``verify_with_uniforms(..., uniforms)``: the same with its randomness given as
  uniforms ``[batch, num_drafts + 1]`` (column i decides draft i, the last column samples
  the emitted token by inverse CDF) — the torch path consumes the same uniforms, so the
  two can be compared draw for draw;
- ``output_law(target, draft, draft_tokens)``: the exact law π(·|x̄) ``[batch, vocab]``;
- ``acceptance_rate(target, draft, num_drafts)``: the exact P(y ∈ x̄) ``[batch]`` — closed
  form or exact recursion, never Monte Carlo.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from specbound.drafts import get_draft_scheme, top_tokens
from specbound.rrs_acceptance import rrs_without_replacement_acceptance
from specbound.probability import (
    as_draft_tokens,
    as_target_and_draft,
    normalize_mass,
    sample_from,
    total_variation,
)


@dataclass(frozen=True)
class Verdict:
    tokens: np.ndarray  # [batch] the emitted token
    accepted: np.ndarray  # [batch] bool, emitted token is one of the drafts


def _take(probs: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """probs[b, tokens[b]] for a column of tokens.  # [batch, vocab], [batch] -> [batch]"""
    return np.take_along_axis(probs, tokens[:, None], axis=-1)[:, 0]


def _zeroed(probs: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Copy of ``probs`` with ``tokens`` [batch, k] set to zero (not renormalised)."""
    out = probs.copy()
    np.put_along_axis(out, tokens, 0.0, axis=-1)
    return out


def _acceptance_ratio(target_mass: np.ndarray, draft_mass: np.ndarray) -> np.ndarray:
    """min(1, target/draft) for draft > 0.  # [batch] -> [batch]"""
    return np.minimum(1.0, target_mass / draft_mass)


def _contains(draft_tokens: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    return np.any(draft_tokens == tokens[:, None], axis=1)


@dataclass(frozen=True)
class Verifier:
    """Base class: subclasses set ``name``, ``scheme`` and the three math methods."""

    name: ClassVar[str]
    scheme: ClassVar[str]
    lossless: ClassVar[bool] = True
    fixed_num_drafts: ClassVar[int | None] = None

    # -- input handling shared by every verifier -------------------------------------
    def _check(self, target_probs, draft_probs, draft_tokens=None, num_drafts=None):
        target, draft = as_target_and_draft(target_probs, draft_probs)
        tokens = None
        if draft_tokens is not None:
            draft_rows = np.shape(draft_tokens)[0] if np.ndim(draft_tokens) == 2 else 1
            if target.shape[0] == 1 and draft_rows > 1:  # one distribution, many draft tuples
                target = np.repeat(target, draft_rows, axis=0)
                draft = np.repeat(draft, draft_rows, axis=0)
            tokens = as_draft_tokens(draft_tokens, target.shape[0], target.shape[1])
            num_drafts = tokens.shape[1]
        self.check_num_drafts(num_drafts, draft)
        if tokens is not None and get_draft_scheme(self.scheme).needs_distinct_support:
            ordered = np.sort(tokens, axis=1)
            if np.any(ordered[:, 1:] == ordered[:, :-1]):
                raise ValueError(
                    f"draft_tokens: the {self.scheme} scheme draws distinct tokens, but a row "
                    "repeats one"
                )
        if tokens is not None and np.any(np.take_along_axis(draft, tokens, axis=1) <= 0):
            raise ValueError(
                "draft_tokens: a draft token has zero draft probability, so it cannot have "
                "been drawn from draft_probs"
            )
        return target, draft, tokens

    def check_num_drafts(self, num_drafts, draft_probs=None) -> None:
        if self.fixed_num_drafts is not None and num_drafts != self.fixed_num_drafts:
            raise ValueError(
                f"num_drafts: verifier {self.name!r} takes exactly {self.fixed_num_drafts} "
                f"draft(s), got {num_drafts}"
            )
        get_draft_scheme(self.scheme).check_num_drafts(num_drafts, draft_probs)

    # -- public API -------------------------------------------------------------------
    def verify(self, target_probs, draft_probs, draft_tokens, rng: np.random.Generator) -> Verdict:
        """Run the verifier once per row.  # tokens [batch, n] -> Verdict([batch], [batch])"""
        target, draft, tokens = self._check(target_probs, draft_probs, draft_tokens)
        uniforms = rng.random((tokens.shape[0], tokens.shape[1] + 1))
        return self._verify(target, draft, tokens, uniforms)

    def verify_with_uniforms(self, target_probs, draft_probs, draft_tokens, uniforms) -> Verdict:
        """``verify`` with its randomness given.  # uniforms [batch, num_drafts + 1]"""
        target, draft, tokens = self._check(target_probs, draft_probs, draft_tokens)
        uniforms = np.asarray(uniforms, dtype=np.float64)
        if uniforms.shape != (tokens.shape[0], tokens.shape[1] + 1):
            raise ValueError(
                f"uniforms: expected shape {(tokens.shape[0], tokens.shape[1] + 1)}, "
                f"got {uniforms.shape}"
            )
        return self._verify(target, draft, tokens, uniforms)

    def output_law(self, target_probs, draft_probs, draft_tokens) -> np.ndarray:
        """Exact law of the emitted token given the drafts.  # -> [batch, vocab]"""
        target, draft, tokens = self._check(target_probs, draft_probs, draft_tokens)
        return self._output_law(target, draft, tokens)

    def acceptance_rate(self, target_probs, draft_probs, num_drafts: int) -> np.ndarray:
        """Exact P(emitted token ∈ drafts) under the verifier's draft scheme.  # -> [batch]"""
        target, draft, _ = self._check(target_probs, draft_probs, num_drafts=num_drafts)
        return self._acceptance_rate(target, draft, num_drafts)

    def verify_torch(self, target_probs, draft_probs, draft_tokens, generator):
        """Torch entry point (see ``specbound.verifiers_torch``); batched, no Python loops
        over batch or vocabulary for the verifiers that have a native torch path."""
        from specbound.verifiers_torch import verify_torch

        return verify_torch(self, target_probs, draft_probs, draft_tokens, generator)

    # -- the math, per subclass ----------------------------------------------------------
    def _verify(self, target, draft, tokens, uniforms) -> Verdict:
        raise NotImplementedError

    def _output_law(self, target, draft, tokens) -> np.ndarray:
        raise NotImplementedError

    def _acceptance_rate(self, target, draft, num_drafts) -> np.ndarray:
        raise NotImplementedError


# --------------------------------------------------------------------------------------
# Recursive rejection sampling (single draft = RRS with n = 1)
# --------------------------------------------------------------------------------------
def _rrs_steps(target, draft, tokens, without_replacement, decide):
    """Walk RRS over the drafts; ``decide(i, accept_prob, pending)`` returns, per row, the
    probability mass (0/1 when sampling) with which draft i is taken.

    RRS [SPECINFER]: residual p¹ = p; accept x_i with min(1, pⁱ(x_i)/qⁱ(x_i)); else
    pⁱ⁺¹ = norm((pⁱ − qⁱ)+). With replacement qⁱ = q; without replacement qⁱ⁺¹ is qⁱ with
    x_i removed and renormalised. Returns the final residual [batch, vocab] and the
    probability [batch] of reaching it.
    """
    current_target, current_draft = target, draft
    reach = np.ones(target.shape[0])
    for i in range(tokens.shape[1]):
        token = tokens[:, i]
        accept = _acceptance_ratio(_take(current_target, token), _take(current_draft, token))
        taken = decide(i, accept, reach)
        reach = reach - taken
        rejected = reach > 0
        if not np.any(rejected):
            break
        mass = np.maximum(current_target[rejected] - current_draft[rejected], 0.0)
        current_target = current_target.copy()
        current_target[rejected] = normalize_mass(mass)
        if without_replacement and i + 1 < tokens.shape[1]:
            current_draft = current_draft.copy()
            current_draft[rejected] = normalize_mass(
                _zeroed(current_draft[rejected], token[rejected, None]), "draft"
            )
    return current_target, reach


@dataclass(frozen=True)
class RecursiveRejection(Verifier):
    without_replacement: ClassVar[bool] = False

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
        return Verdict(emitted, _contains(tokens, emitted))

    def _output_law(self, target, draft, tokens):
        law = np.zeros_like(target)
        rows = np.arange(target.shape[0])

        def decide(i, accept, reach):
            np.add.at(law, (rows, tokens[:, i]), reach * accept)
            return reach * accept

        final_residual, reach = _rrs_steps(target, draft, tokens, self.without_replacement, decide)
        return law + reach[:, None] * final_residual

    def _acceptance_rate(self, target, draft, num_drafts):
        if not self.without_replacement:
            # α = 1 − Π_i (1 − Σ min(pⁱ, q)); the residual chain does not depend on the drafts.
            # 1 − Σ min(pⁱ, q) is taken as Σ (pⁱ − q)+, the residual's own mass: for rows
            # equal up to rounding the two-sided TV can be 1e-17 while (pⁱ − q)+ is all zero.
            rejection = np.ones(target.shape[0])
            current = target
            for _ in range(num_drafts):
                excess = np.maximum(current - draft, 0.0)
                step_rejection = excess.sum(axis=-1)
                rejection = rejection * step_rejection
                live = step_rejection > 0
                if not np.any(live):
                    break
                current = current.copy()
                current[live] = excess[live] / step_rejection[live, None]
            return 1.0 - rejection
        return np.array(
            [rrs_without_replacement_acceptance(t, d, num_drafts) for t, d in zip(target, draft)]
        )


@dataclass(frozen=True)
class SpeculativeSampling(RecursiveRejection):
    """Speculative sampling [LEV]: accept x ~ q with min(1, p(x)/q(x)), else emit from
    norm((p − q)+). Lossless; α = Σ min(p, q) = 1 − TV(p, q)."""

    name: ClassVar[str] = "single"
    scheme: ClassVar[str] = "with_replacement"
    fixed_num_drafts: ClassVar[int | None] = 1


@dataclass(frozen=True)
class RRS(RecursiveRejection):
    """Recursive rejection sampling, i.i.d. drafts [SPECINFER]; α = 1 − Π(1 − Σ min(pⁱ, q))."""

    name: ClassVar[str] = "rrs"
    scheme: ClassVar[str] = "with_replacement"


@dataclass(frozen=True)
class RRSWithoutReplacement(RecursiveRejection):
    """Recursive rejection sampling with drafts drawn without replacement; the draft law
    shrinks with each rejected token (SPEC §4.3). α by exact recursion, see
    ``specbound.rrs_acceptance``."""

    name: ClassVar[str] = "rrs_without_replacement"
    scheme: ClassVar[str] = "without_replacement"
    without_replacement: ClassVar[bool] = True


# --------------------------------------------------------------------------------------
# K-SEQ [SPECTR]
# --------------------------------------------------------------------------------------
def kseq_scale(target, draft, num_drafts, iterations: int = 200) -> np.ndarray:
    """ρ* per row: the root on [1, n] of p_acc(ρ) = ρ·β(ρ), β(ρ) = Σ min(p/ρ, q),
    p_acc(ρ) = 1 − (1 − β(ρ))ⁿ [SPECTR]. p_acc − ρβ is decreasing in ρ, ≥ 0 at 1 and ≤ 0
    at n; bisection returns the upper end of the bracket, where p_acc ≤ ρβ, so the
    residual below is non-negative without clipping.  # [batch, vocab] x2 -> [batch]"""
    low = np.ones(target.shape[0])
    high = np.full(target.shape[0], float(num_drafts))
    for _ in range(iterations):
        middle = 0.5 * (low + high)
        beta = np.minimum(target / middle[:, None], draft).sum(axis=1)
        above = 1.0 - (1.0 - beta) ** num_drafts >= middle * beta
        low = np.where(above, middle, low)
        high = np.where(above, high, middle)
        if np.all(high - low <= 4 * np.finfo(float).eps * high):
            break
    return high


@dataclass(frozen=True)
class KSeq(Verifier):
    """K-SEQ [SPECTR], i.i.d. drafts: accept x_i in turn with min(1, p(x_i)/(ρ*·q(x_i)));
    if none is accepted, emit from norm((p − (p_acc/β)·min(p/ρ*, q))+). The residual
    sample may equal a draft, which counts as accepted:
    α = p_acc + (1 − β)ⁿ Σ_y r(y)(1 − (1 − w(y))ⁿ), w(y) = q(y)(1 − a(y))/(1 − β)."""

    name: ClassVar[str] = "kseq"
    scheme: ClassVar[str] = "with_replacement"

    @staticmethod
    def _parts(target, draft, num_drafts):
        scale = kseq_scale(target, draft, num_drafts)[:, None]
        accepted_mass = np.minimum(target / scale, draft)  # [batch, vocab] = q·a
        beta = accepted_mass.sum(axis=1, keepdims=True)
        p_acc = 1.0 - (1.0 - beta) ** num_drafts
        leftover = np.maximum(target - (p_acc / beta) * accepted_mass, 0.0)
        return scale, accepted_mass, beta, leftover

    def _verify(self, target, draft, tokens, uniforms):
        scale, _, _, leftover = self._parts(target, draft, tokens.shape[1])
        emitted = np.full(tokens.shape[0], -1)
        pending = np.ones(tokens.shape[0], dtype=bool)
        for i in range(tokens.shape[1]):
            token = tokens[:, i]
            accept = _acceptance_ratio(_take(target, token), scale[:, 0] * _take(draft, token))
            taken = pending & (uniforms[:, i] < accept)
            emitted[taken] = token[taken]
            pending &= ~taken
        if np.any(pending):
            emitted[pending] = sample_from(
                normalize_mass(leftover[pending]), uniforms[pending, -1]
            )
        return Verdict(emitted, _contains(tokens, emitted))

    def _output_law(self, target, draft, tokens):
        scale, _, _, leftover = self._parts(target, draft, tokens.shape[1])
        law = np.zeros_like(target)
        rows = np.arange(target.shape[0])
        reach = np.ones(target.shape[0])
        for i in range(tokens.shape[1]):
            token = tokens[:, i]
            accept = _acceptance_ratio(_take(target, token), scale[:, 0] * _take(draft, token))
            np.add.at(law, (rows, token), reach * accept)
            reach = reach * (1.0 - accept)
        live = reach > 0
        law[live] += reach[live, None] * normalize_mass(leftover[live])
        return law

    def _acceptance_rate(self, target, draft, num_drafts):
        _, accepted_mass, beta, leftover = self._parts(target, draft, num_drafts)
        none_accepted = (1.0 - beta[:, 0]) ** num_drafts
        # a leftover without mass means every draft is accepted (β = 1 up to rounding)
        live = (none_accepted > 0) & (leftover.sum(axis=1) > 0)
        hits = np.zeros(target.shape[0])
        if np.any(live):
            rejected_draft = (draft[live] - accepted_mass[live]) / (1.0 - beta[live])
            residual_law = normalize_mass(leftover[live])
            hits[live] = (residual_law * (1.0 - (1.0 - rejected_draft) ** num_drafts)).sum(axis=1)
        return 1.0 - none_accepted + none_accepted * hits


# --------------------------------------------------------------------------------------
# Greedy drafts [HU] and SpecHub [SPECHUB]
# --------------------------------------------------------------------------------------
def _greedy_parts(target, draft, top):
    """For the top set T ([batch, n−1]): q′ = q·1[∉T]/(1 − q(T)) and the residual weights
    p·1[T] + (p − q′)+·1[∉T] (unnormalised)."""
    in_top = np.zeros(target.shape, dtype=bool)
    np.put_along_axis(in_top, top, True, axis=-1)
    rest_draft = np.where(in_top, 0.0, draft)
    rest_draft = rest_draft / rest_draft.sum(axis=1, keepdims=True)
    leftover = np.where(in_top, target, np.maximum(target - rest_draft, 0.0))
    return in_top, rest_draft, leftover


def _check_top_set(draft, top):
    """The first n−1 greedy drafts must be a most-probable set of q."""
    if top.shape[1] == 0:
        return
    smallest_in_top = np.take_along_axis(draft, top, axis=1).min(axis=1)
    outside = _zeroed(draft, top).max(axis=1)
    if np.any(smallest_in_top < outside):
        raise ValueError(
            "draft_tokens: the first n-1 greedy drafts must be the n-1 most probable draft "
            "tokens"
        )


@dataclass(frozen=True)
class Greedy(Verifier):
    """Hu et al.'s greedy verifier: with T the top n−1 drafts and x_n ~ q′, emit x_n with
    min(1, p(x_n)/q′(x_n)), else emit y ~ norm(p·1[y∈T] + (p − q′)+·1[y∉T]). Lossless, and
    α = p(T) + Σ_{x∉T} min(p(x), q′(x)) = α*_greedy [HU]."""

    name: ClassVar[str] = "greedy"
    scheme: ClassVar[str] = "greedy"

    def _ordered(self, draft, tokens):
        """(top set [batch, n−1], sampled last draft [batch]) in the greedy layout."""
        _check_top_set(draft, tokens[:, :-1])
        return tokens[:, :-1], tokens[:, -1]

    def _verify(self, target, draft, tokens, uniforms):
        top, last = self._ordered(draft, tokens)
        _, rest_draft, leftover = _greedy_parts(target, draft, top)
        accept = _acceptance_ratio(_take(target, last), _take(rest_draft, last))
        emitted = last.copy()
        rejected = uniforms[:, 0] >= accept
        if np.any(rejected):
            emitted[rejected] = sample_from(
                normalize_mass(leftover[rejected]), uniforms[rejected, -1]
            )
        return Verdict(emitted, _contains(tokens, emitted))

    def _output_law(self, target, draft, tokens):
        top, last = self._ordered(draft, tokens)
        _, rest_draft, leftover = _greedy_parts(target, draft, top)
        accept = _acceptance_ratio(_take(target, last), _take(rest_draft, last))
        law = np.zeros_like(target)
        np.put_along_axis(law, last[:, None], accept[:, None], axis=1)
        live = accept < 1
        law[live] += (1.0 - accept[live, None]) * normalize_mass(leftover[live])
        return law

    def _acceptance_rate(self, target, draft, num_drafts):
        in_top, rest_draft, _ = _greedy_parts(target, draft, top_tokens(draft, num_drafts - 1))
        return np.where(in_top, target, np.minimum(target, rest_draft)).sum(axis=1)


@dataclass(frozen=True)
class SpecHub(Greedy):
    """SpecHub [SPECHUB], n = 2, with SpecHub pairs around the hub a = argmax q. Its pair
    *set* has the greedy law ({a, z}, z ~ q(·|≠a)), and its verifier routes the excess mass
    through the hub: emit z with min(1, p(z)/q′(z)), else emit a with probability
    p(a)/P(reject) and otherwise from norm((p − q′)+) off the hub — the greedy verifier
    with T = {a}, so α = p(a) + Σ_{z≠a} min(p(z), q′(z)) = α*_greedy(n = 2)."""

    name: ClassVar[str] = "spechub"
    scheme: ClassVar[str] = "spechub"
    fixed_num_drafts: ClassVar[int | None] = 2

    def _ordered(self, draft, tokens):
        hub = top_tokens(draft, 1)[:, 0]
        if np.any((tokens[:, 0] != hub) & (tokens[:, 1] != hub)):
            raise ValueError("draft_tokens: a SpecHub pair must contain the hub argmax q")
        other = np.where(tokens[:, 0] == hub, tokens[:, 1], tokens[:, 0])
        return hub[:, None], other


# --------------------------------------------------------------------------------------
# The optimal-transport verifier
# --------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=256)
def _solved_coupling(target_bytes: bytes, draft_bytes: bytes, num_drafts: int, scheme: str):
    from specbound.bounds import MAX_LP_VARIABLES, optimal_coupling

    target_row = np.frombuffer(target_bytes)
    tuples, tuple_probs = get_draft_scheme(scheme).joint_law(
        np.frombuffer(draft_bytes), num_drafts, max_tuples=MAX_LP_VARIABLES // len(target_row)
    )
    coupling, acceptance = optimal_coupling(target_row, tuples, tuple_probs)
    index = {tuple(row): k for k, row in enumerate(tuples.tolist())}
    return index, coupling / tuple_probs[:, None], acceptance


@dataclass(frozen=True)
class OptimalTransport(Verifier):
    """The optimal verifier for any draft scheme: solve the coupling LP
    max P(y ∈ x̄) over π(y, x̄) with marginals p and D (SPEC §4.2, [HU]) and emit
    y ~ π(·|x̄). Lossless and α = α*(p, D). Only for small problems: the LP has
    |supp D|·V variables (``specbound.bounds.optimal_coupling`` states the limit)."""

    name: ClassVar[str] = "optimal"
    draft_scheme: str = "with_replacement"

    def __post_init__(self):
        get_draft_scheme(self.draft_scheme)

    @property
    def scheme(self) -> str:  # type: ignore[override]
        return self.draft_scheme

    def _rows(self, target, draft, num_drafts):
        for target_row, draft_row in zip(target, draft):
            yield _solved_coupling(target_row.tobytes(), draft_row.tobytes(), num_drafts, self.scheme)

    def _output_law(self, target, draft, tokens):
        laws = []
        for (index, conditional, _), draft_tuple in zip(self._rows(target, draft, tokens.shape[1]), tokens):
            laws.append(conditional[index[tuple(draft_tuple.tolist())]])
        return np.array(laws)

    def _verify(self, target, draft, tokens, uniforms):
        emitted = sample_from(self._output_law(target, draft, tokens), uniforms[:, -1])
        return Verdict(emitted, _contains(tokens, emitted))

    def _acceptance_rate(self, target, draft, num_drafts):
        return np.array([acceptance for _, _, acceptance in self._rows(target, draft, num_drafts)])


# --------------------------------------------------------------------------------------
# ε-biased single-draft decoding [YIN §4]
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BiasedDecoding(Verifier):
    """Accept the draft x with b(x) = min(1, (p(x) + ε)/q(x)), else emit from a resampling
    law R. Not lossless for ε > 0: the output law is O = b·q + R·Σ(1 − b)q and its bias is
    TV(O, p) (SPEC §3). ``rejection_rate`` = 1 − Σ b·q is the rate at which the draft test
    fails; ``acceptance_rate`` is P(y = x), which also counts a resample equal to x."""

    scheme: ClassVar[str] = "with_replacement"
    lossless: ClassVar[bool] = False
    fixed_num_drafts: ClassVar[int | None] = 1
    epsilon: float = 0.0

    def __post_init__(self):
        if not (np.isfinite(self.epsilon) and self.epsilon >= 0):
            raise ValueError(f"epsilon: must be a finite number >= 0, got {self.epsilon!r}")

    def acceptance_weights(self, target, draft) -> np.ndarray:
        """b = min(1, (p + ε)/q) where q > 0 (1 elsewhere).  # [batch, vocab]"""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(draft > 0, np.minimum(1.0, (target + self.epsilon) / draft), 1.0)

    def resampling_law(self, target, draft) -> np.ndarray:
        raise NotImplementedError

    def _verify(self, target, draft, tokens, uniforms):
        draft_token = tokens[:, 0]
        accept = _take(self.acceptance_weights(target, draft), draft_token)
        emitted = draft_token.copy()
        rejected = uniforms[:, 0] >= accept
        if np.any(rejected):
            emitted[rejected] = sample_from(
                self.resampling_law(target[rejected], draft[rejected]), uniforms[rejected, -1]
            )
        return Verdict(emitted, _contains(tokens, emitted))

    def _output_law(self, target, draft, tokens):
        draft_token = tokens[:, 0]
        accept = _take(self.acceptance_weights(target, draft), draft_token)
        law = np.zeros_like(target)
        np.put_along_axis(law, draft_token[:, None], accept[:, None], axis=1)
        live = accept < 1
        law[live] += (1.0 - accept[live, None]) * self.resampling_law(target[live], draft[live])
        return law

    def _rejection_mass(self, target, draft):
        return ((1.0 - self.acceptance_weights(target, draft)) * draft).sum(axis=1)

    def output_distribution(self, target_probs, draft_probs) -> np.ndarray:
        """Exact marginal output law O = b·q + R·Σ(1 − b)q.  # -> [batch, vocab]"""
        target, draft, _ = self._check(target_probs, draft_probs, num_drafts=1)
        weights = self.acceptance_weights(target, draft)
        rejection = self._rejection_mass(target, draft)
        out = weights * draft
        live = rejection > 0
        out[live] += rejection[live, None] * self.resampling_law(target[live], draft[live])
        return out

    def rejection_rate(self, target_probs, draft_probs) -> np.ndarray:
        """P(the draft test fails) = 1 − Σ b·q.  # -> [batch]"""
        target, draft, _ = self._check(target_probs, draft_probs, num_drafts=1)
        return self._rejection_mass(target, draft)

    def bias(self, target_probs, draft_probs) -> np.ndarray:
        """Exact TV(O, p) per row.  # -> [batch]"""
        target, _ = as_target_and_draft(target_probs, draft_probs)
        return total_variation(self.output_distribution(target_probs, draft_probs), target)

    def _acceptance_rate(self, target, draft, num_drafts):
        """P(y = x) = Σ_x q(x)·[b(x) + (1 − b(x))·R(x)]."""
        weights = self.acceptance_weights(target, draft)
        rejected_draft = (1.0 - weights) * draft
        live = rejected_draft.sum(axis=1) > 0
        hits = np.zeros(target.shape[0])
        if np.any(live):
            resample = self.resampling_law(target[live], draft[live])
            hits[live] = (rejected_draft[live] * resample).sum(axis=1)
        return (weights * draft).sum(axis=1) + hits


@dataclass(frozen=True)
class DecodingOPT(BiasedDecoding):
    """Decoding-OPT [YIN §4, Thm 5]: R = norm((p − q)+), the optimal resampling law for
    this b; its bias equals Loss*(b) and P(reject) + bias = TV(p, q)."""

    name: ClassVar[str] = "decoding_opt"

    def resampling_law(self, target, draft):
        return normalize_mass(np.maximum(target - draft, 0.0))


@dataclass(frozen=True)
class DecodingUNO(BiasedDecoding):
    """Decoding-UNO [YIN §4]: same b, resamples from the target p (the paper's text), or
    from the draft q with ``resample="draft"`` (the paper's printed code)."""

    name: ClassVar[str] = "decoding_uno"
    resample: str = "target"

    def __post_init__(self):
        super().__post_init__()
        if self.resample not in ("target", "draft"):
            raise ValueError(f"resample: expected 'target' or 'draft', got {self.resample!r}")

    def resampling_law(self, target, draft):
        return target if self.resample == "target" else draft


VERIFIERS: dict[str, type[Verifier]] = {
    verifier.name: verifier
    for verifier in [
        SpeculativeSampling,
        RRS,
        RRSWithoutReplacement,
        KSeq,
        SpecHub,
        Greedy,
        OptimalTransport,
        DecodingOPT,
        DecodingUNO,
    ]
}


def get_verifier(name: str, **parameters) -> Verifier:
    """Look a verifier up by name; ``parameters`` go to its constructor
    (``epsilon`` for decoding_opt/uno, ``resample`` for decoding_uno,
    ``draft_scheme`` for optimal)."""
    try:
        verifier_class = VERIFIERS[name]
    except KeyError:
        raise ValueError(
            f"verifier: unknown verifier {name!r}; choose one of {sorted(VERIFIERS)}"
        ) from None
    try:
        return verifier_class(**parameters)
    except TypeError:
        raise ValueError(
            f"verifier: {name!r} does not take parameters {sorted(parameters)}"
        ) from None
