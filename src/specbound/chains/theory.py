"""Exact cost of speculative decoding on Markov chains (SPEC.md §1, §2; [YIN] §3).

Letters follow SPEC.md §0: p is the *target*, q the *draft* ([YIN] uses the opposite letters).

A ``MarkovChainPair`` is the target and the draft law of a token sequence x_1..x_T in which
the next token depends only on the previous one, with transition matrices that may change
with the position (non-stationary): ``target_transitions[t - 1, a, b] = p_t(x_t = b | x_{t-1}
= a)``, likewise for the draft, and the prompt token x_0 drawn from ``prompt_probs``.

Decoding runs in *rounds*; each round costs one target call. With lookahead K = ∞ (the
paper's idealisation) a round drafts to the horizon T and ends at its first rejection (one
residual token emitted) or at the horizon. Counts reported:

- ``rejections``: N_rej, the number of rounds that ended with a rejection — the paper's count;
  its acceleration is T / E[N_rej].
- ``target_calls``: the number of rounds, N_rej + 1 when the last round reached the horizon
  without a rejection; T / E[target_calls] is the tokens per target call an engine sees.

Every emitted token is target-distributed given its prefix, so the output x_{0:T} follows the
target chain and ``m_t`` (the law of x_t) evolves as m_t = m_{t-1} · P_t.

Work: a chain pair holds 2·T·V² numbers and the exact costs work on a few more arrays of
that shape, M times over for M drafts (the residual chain Π r_m is M steps) and γ times
for a lookahead γ. ``chain_bytes`` and ``exact_cost_seconds`` estimate it (a cost per
T·V²·M and per T·V²·γ entry from ``specbound.work_limits``); drawing a chain and
the exact costs refuse with ``checks.WorkLimitError`` beyond ``CHAIN_BYTES_LIMIT`` and
``EXACT_SECONDS_LIMIT``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from specbound.checks import positive_int, within_limit
from specbound.probability import as_distributions, as_target_and_draft, total_variation
from specbound.verifiers.rrs import unaccepted_mass
from specbound.work_limits import (
    CHAIN_DRAW_SECONDS_PER_ENTRY,
    CHAIN_SECONDS_PER_ENTRY,
    IMPROVEMENT_SECONDS_FIXED,
    IMPROVEMENT_SECONDS_PER_STEP,
    IMPROVEMENT_SECONDS_PER_STEP_TOKEN,
    IMPROVEMENT_SECONDS_PER_TOKEN,
)

CHAIN_BYTES_LIMIT = 2 * 2**30  # a chain pair and the arrays of its exact costs
EXACT_SECONDS_LIMIT = 30.0
ARRAYS_PER_CHAIN = 6  # P, Q, (P − Q)+, Π r_m·p^{M+1}, min(P, Q) and a temporary, each [T, V, V]


def chain_bytes(horizon: int, vocab_size: int) -> float:
    """Bytes of a chain pair of horizon T over V states with the arrays its exact costs use."""
    return 8.0 * ARRAYS_PER_CHAIN * horizon * vocab_size**2


def chain_draw_seconds(horizon: int, vocab_size: int) -> float:
    """Seconds of ``random_chain_pair``: 2·T·V² Dirichlet coordinates and the row checks."""
    return CHAIN_DRAW_SECONDS_PER_ENTRY * horizon * vocab_size**2


def exact_cost_seconds(horizon: int, vocab_size: int, num_drafts, lookahead: int | None = None) -> float:
    """Seconds of ``batch_expected_rejections`` (``lookahead`` None) or of
    ``lookahead_expected_cost``: T·V² entries, once per draft of the residual chain (once
    for M = ∞) and once per offset of a finite lookahead (at most T)."""
    drafts = 1 if num_drafts == math.inf else num_drafts
    steps = drafts + (0 if lookahead is None else min(lookahead, horizon) + 1)
    return CHAIN_SECONDS_PER_ENTRY * horizon * vocab_size**2 * (steps + 2)


def check_chain_size(horizon: int, vocab_size: int) -> None:
    """WorkLimitError when a chain pair of this size would not fit in ``CHAIN_BYTES_LIMIT``."""
    within_limit(f"horizon × vocab_size² (T = {horizon:,}, V = {vocab_size:,})", chain_bytes(horizon, vocab_size),
                 CHAIN_BYTES_LIMIT, "bytes", hint="a smaller horizon or vocabulary")


def _check_exact_cost(chain: MarkovChainPair, num_drafts, lookahead=None) -> None:
    within_limit(f"num_drafts × horizon × vocab_size² (M = {num_drafts}, T = {chain.horizon:,}, "
                 f"V = {chain.vocab_size:,})", exact_cost_seconds(chain.horizon, chain.vocab_size, num_drafts, lookahead),
                 EXACT_SECONDS_LIMIT, "s", hint="fewer drafts (M = ∞ costs one step), a smaller chain")


@dataclass(frozen=True)
class MarkovChainPair:
    """Target and draft Markov chains over a horizon of T positions, with a prompt law.

    Checked on construction: shapes ``[T, V, V]``, ``[T, V, V]``, ``[V]`` with T ≥ 1 and every
    row a probability vector (ValueError naming the argument otherwise).
    """

    target_transitions: np.ndarray  # [horizon, vocab, vocab]; row = previous token
    draft_transitions: np.ndarray  # [horizon, vocab, vocab]
    prompt_probs: np.ndarray  # [vocab]; law of the prompt token x_0

    def __post_init__(self):
        target = _as_transitions("target_transitions", self.target_transitions)
        draft = _as_transitions("draft_transitions", self.draft_transitions)
        if draft.shape != target.shape:
            raise ValueError(
                f"draft_transitions: shape {draft.shape} differs from target_transitions' "
                f"{target.shape}"
            )
        prompt = np.asarray(self.prompt_probs, dtype=np.float64)
        if prompt.shape != (target.shape[1],):
            raise ValueError(
                f"prompt_probs: expected shape ({target.shape[1]},) to match the vocabulary, "
                f"got {prompt.shape}"
            )
        object.__setattr__(self, "target_transitions", target)
        object.__setattr__(self, "draft_transitions", draft)
        object.__setattr__(self, "prompt_probs", as_distributions("prompt_probs", prompt)[0])

    @property
    def horizon(self) -> int:
        return self.target_transitions.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.target_transitions.shape[1]


def _as_transitions(name: str, transitions) -> np.ndarray:
    array = np.asarray(transitions, dtype=np.float64)
    if array.ndim != 3 or array.shape[1] != array.shape[2]:
        raise ValueError(f"{name}: expected shape [horizon, vocab, vocab], got {array.shape}")
    if array.shape[0] == 0:
        raise ValueError(f"{name}: the horizon T must be at least 1, got T = 0")
    rows = as_distributions(f"{name} (every row)", array.reshape(-1, array.shape[2]))
    return rows.reshape(array.shape)


def random_chain_pair(
    horizon: int, vocab_size: int, rng: np.random.Generator, concentration: float = 1.0
) -> MarkovChainPair:
    """A random non-stationary chain pair with a uniform prompt law.

    Law: every row of every target matrix P_t, then every row of every draft matrix Q_t, is
    drawn independently from Dirichlet(concentration · 1_V), in that order from ``rng``
    (concentration 1 = uniform on the simplex). [YIN] Fig. 2 does not say how its chains were
    drawn; this is our stated choice.
    """
    positive_int("horizon", horizon)
    positive_int("vocab_size", vocab_size)
    if not concentration > 0:
        raise ValueError(f"concentration: must be positive, got {concentration}")
    check_chain_size(horizon, vocab_size)
    alpha = np.full(vocab_size, float(concentration))
    target = rng.dirichlet(alpha, size=(horizon, vocab_size))
    draft = rng.dirichlet(alpha, size=(horizon, vocab_size))
    return MarkovChainPair(target, draft, np.full(vocab_size, 1.0 / vocab_size))


@dataclass(frozen=True)
class ExpectedCost:
    """Exact expected counts of one decoding of the horizon (see the module docstring)."""

    horizon: int
    rejections: float  # E[N_rej]
    target_calls: float  # E[number of rounds]

    @property
    def acceleration(self) -> float:
        """[YIN]'s acceleration T / E[N_rej] (ignores the final call when it has no rejection);
        ∞ when no round can end in a rejection (target = draft)."""
        return self.horizon / self.rejections if self.rejections > 0 else math.inf

    @property
    def tokens_per_call(self) -> float:
        """T / E[target calls], counting every round."""
        return self.horizon / self.target_calls


def check_num_drafts(num_drafts) -> None:
    """Raise ValueError unless ``num_drafts`` is an integer ≥ 1 or math.inf (the limit)."""
    if num_drafts != math.inf:
        positive_int("num_drafts", num_drafts)


def check_lookahead(lookahead) -> None:
    """Raise ValueError unless ``lookahead`` is None (K = ∞) or an integer γ ≥ 1."""
    if lookahead is not None:
        positive_int("lookahead", lookahead)


def unaccepted_root_mass(target_probs, draft_probs, num_drafts) -> np.ndarray:
    """Π_m r_m · p^{M+1}: the target mass that recursive rejection with M i.i.d. drafts fails
    to accept at a round's root, as an unnormalised law of the residual token it then emits
    (SPEC.md §2) — the RRS verifier's own quantity, ``verifiers.rrs.unaccepted_mass``
    (which states its M → ∞ limit).  # [batch, vocab] x2 -> [batch, vocab]
    """
    check_num_drafts(num_drafts)
    target, draft = as_target_and_draft(target_probs, draft_probs)
    return unaccepted_mass(target, draft, num_drafts)


def batch_rejection_probability(target_probs, draft_probs, num_drafts) -> np.ndarray:
    """Π_{m≤M} TV(p^m, q): P(recursive rejection rejects all M i.i.d. drafts).  # -> [batch]"""
    return unaccepted_root_mass(target_probs, draft_probs, num_drafts).sum(axis=-1)


def batch_improvement_seconds(vocab_size: int, num_drafts) -> float:
    """Estimated seconds of one ``batch_improvement`` row: its checks, then M steps of the
    residual chain over V tokens (one for M = ∞)."""
    steps = 1 if num_drafts == math.inf else num_drafts
    return (IMPROVEMENT_SECONDS_FIXED + IMPROVEMENT_SECONDS_PER_TOKEN * vocab_size
            + steps * (IMPROVEMENT_SECONDS_PER_STEP + IMPROVEMENT_SECONDS_PER_STEP_TOKEN * vocab_size))


def batch_improvement(target_probs, draft_probs, num_drafts) -> np.ndarray:
    """Single-token batch improvement BI = TV(p, q) − Π_{m≤M} TV(p^m, q) [YIN Prop. 1].
    # [batch, vocab] x2 -> [batch]"""
    target, draft = as_target_and_draft(target_probs, draft_probs)
    return total_variation(target, draft) - batch_rejection_probability(
        target, draft, num_drafts
    )


def bernoulli_batch_improvement(draft_mean: float, target_mean: float, num_drafts) -> float:
    """BI for draft Ber(u), target Ber(v) [YIN §3.2]: (u − v)(1 − u^{M−1}) when u ≥ v.

    For u < v relabel 0 ↔ 1: BI = (v − u)(1 − (1 − u)^{M−1}). M = ∞ gives |u − v| unless the
    draft is a point mass the target is not (then the product stays at TV and BI = 0).
    """
    check_num_drafts(num_drafts)
    for name, value in (("draft_mean", draft_mean), ("target_mean", target_mean)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name}: a Bernoulli mean must lie in [0, 1], got {value}")
    if draft_mean < target_mean:
        draft_mean, target_mean = 1.0 - draft_mean, 1.0 - target_mean
    return (draft_mean - target_mean) * (1.0 - draft_mean ** (num_drafts - 1))


def uniform_batch_improvement(vocab_size: int, target_support_size: int, num_drafts) -> float:
    """BI for draft uniform on V tokens, target uniform on V′ of them [YIN §3.2]:
    with r = V / V′, BI = (1 − 1/r) − (1 − 1/r)^M (every residual is the target itself)."""
    check_num_drafts(num_drafts)
    if not 1 <= target_support_size <= vocab_size:
        raise ValueError(
            f"target_support_size: must lie in [1, vocab_size = {vocab_size}], got "
            f"{target_support_size}"
        )
    single_rejection = 1.0 - target_support_size / vocab_size
    return single_rejection - single_rejection**num_drafts


def expected_rejections(chain: MarkovChainPair) -> ExpectedCost:
    """Single-draft speculative sampling, lookahead K = ∞ [YIN Thm 1]:

        E[N_rej] = Σ_{t=1..T} E_{x_{t-1} ~ m_{t-1}}[ TV(P_t[x_{t-1}], Q_t[x_{t-1}]) ],

    by the forward pass S += m · tv_rows(P_t, Q_t); m = m · P_t. The last round has no
    rejection unless position T was rejected, so E[calls] = E[N_rej] + 1 − m_{T-1} · tv_T.
    """
    tv = total_variation(chain.target_transitions, chain.draft_transitions)  # [T, V]
    law = chain.prompt_probs  # [V], law of x_{t-1}
    rejections = 0.0
    last_rejection = 0.0
    for position in range(chain.horizon):
        last_rejection = law @ tv[position]
        rejections += last_rejection
        law = law @ chain.target_transitions[position]
    return ExpectedCost(chain.horizon, float(rejections), float(rejections + 1.0 - last_rejection))


def batch_expected_rejections(chain: MarkovChainPair, num_drafts) -> ExpectedCost:
    """Batch speculative decoding with M i.i.d. drafts, lookahead K = ∞ [YIN Thm 3, Alg. 4]:

        E[N_rej] = Σ_t E_{m_{t-1}}[TV_t] − Σ_t Σ_a F_{t-1}(a) · (TV_t(a) − Π_m r_m,t(a)),

    where F_t(b) = Σ_{x_{0:t-1}} f(x_{0:t-1}, b) marginalises the f-recursion of SPEC.md §2,
    f = P(prefix and its last position was rejected, so the next position is a root):

        F_0 = m_0,  F_t = m_{t-1} · H_t − F_{t-1} · (H_t − U_t),

    H_t = max(0, P_t − Q_t) and U_t = Π_m r_m · p^{M+1} row-wise (``unaccepted_root_mass``).
    The recursion is linear in the prefix weights with coefficients that depend only on
    (x_{t-1}, x_t), which is why marginalising over all but the last token is exact.
    M = 1 gives Thm 1; ``num_drafts = math.inf`` gives the M → ∞ limit, which stays positive.
    E[calls] = E[N_rej] + 1 − P(position T rejected) = E[N_rej] + 1 − Σ F_T.
    """
    check_num_drafts(num_drafts)
    _check_exact_cost(chain, num_drafts)
    target, draft = chain.target_transitions, chain.draft_transitions
    excess = np.maximum(target - draft, 0.0)  # H_t, [T, V, V]
    unaccepted = unaccepted_mass(target, draft, num_drafts)  # U_t, [T, V, V]
    tv = excess.sum(axis=-1)  # [T, V]
    root_rejection = unaccepted.sum(axis=-1)  # Π_m r_m, [T, V]
    law = chain.prompt_probs  # m_{t-1}
    rejected = chain.prompt_probs  # F_{t-1}: position 1 is always a root
    rejections = 0.0
    for position in range(chain.horizon):
        rejections += law @ tv[position] - rejected @ (tv[position] - root_rejection[position])
        rejected = law @ excess[position] - rejected @ (excess[position] - unaccepted[position])
        law = law @ target[position]
    return ExpectedCost(chain.horizon, float(rejections), float(rejections + 1.0 - rejected.sum()))


def lookahead_expected_cost(
    chain: MarkovChainPair, num_drafts, lookahead: int | None
) -> ExpectedCost:
    """Exact cost with a finite lookahead γ and the bonus token (SPEC.md §1 "Finite lookahead").

    Each round drafts min(γ, tokens left) tokens along M i.i.d. drafts, verifies the first
    position (the root) by recursive rejection and then the accepted draft by plain
    speculative sampling; if all γ are accepted the target call's last position supplies a
    bonus token from p (no rejection possible there). A forward pass over
    G_t[a, k] = P(x_{t-1} = a, position t is at offset k of its round), k = 0 (root) .. γ
    (bonus) gives E[N_rej] = Σ_t Σ_a (G_t[a,0] Π r_m,t(a) + Σ_{0<k<γ} G_t[a,k] TV_t(a)) and
    E[calls] = Σ_t Σ_a G_t[a, 0]. ``lookahead=None`` (K = ∞) means γ = T: no bonus, and the
    result equals Thm 1 / Thm 3 (an independent check of the f-recursion). A lookahead
    beyond T is T: no round can draft past the horizon, so offsets above T never fill.
    """
    check_num_drafts(num_drafts)
    check_lookahead(lookahead)
    _check_exact_cost(chain, num_drafts, lookahead)
    lookahead = min(lookahead or chain.horizon, chain.horizon)
    target, draft = chain.target_transitions, chain.draft_transitions
    excess = np.maximum(target - draft, 0.0)  # rejection mass after a root, [T, V, V]
    unaccepted = unaccepted_mass(target, draft, num_drafts)  # at a root, [T, V, V]
    overlap = np.minimum(target, draft)  # acceptance mass after a root, [T, V, V]
    offsets = np.zeros((chain.vocab_size, lookahead + 1))  # G_t, [V, γ + 1]
    offsets[:, 0] = chain.prompt_probs
    rejections = calls = 0.0
    for position in range(chain.horizon):
        root, drafted, bonus = offsets[:, 0], offsets[:, 1:lookahead], offsets[:, lookahead]
        rejections += root @ unaccepted[position].sum(axis=-1)
        rejections += drafted.sum(axis=1) @ excess[position].sum(axis=-1)
        calls += root.sum()
        following = np.zeros_like(offsets)
        following[:, 0] = (
            root @ unaccepted[position]
            + drafted.sum(axis=1) @ excess[position]
            + bonus @ target[position]
        )
        following[:, 1] = root @ (target[position] - unaccepted[position])
        following[:, 2:] = (drafted.T @ overlap[position]).T
        offsets = following
    return ExpectedCost(chain.horizon, float(rejections), float(calls))
