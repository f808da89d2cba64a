"""Draft schemes: how n draft tokens are proposed from one draft distribution (SPEC §4.1).

Each scheme offers
- ``sample(draft_probs, num_drafts, rng)``: draws ``[batch, num_drafts]`` token ids, and
- ``joint_law(draft_probs_row, num_drafts)``: the exact joint law D(x1..xn) of one row as
  (tuples ``[K, num_drafts]``, probabilities ``[K]``), enumerated over the draft's support;
  only for small vocabularies (tests, the LP bounds, the optimal verifier).

Ties in the draft distribution are broken towards the lower token id everywhere
(the hub of SpecHub, the top set of greedy), so samplers and verifiers agree.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from specbound.probability import as_distributions, sample_from, support_size

MAX_ENUMERATED_TUPLES = 2_000_000


@dataclass(frozen=True)
class DraftScheme:
    name: str
    description: str
    sample_rows: Callable[[np.ndarray, int, np.random.Generator], np.ndarray]
    enumerate_row: Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]
    needs_distinct_support: bool  # n drafts need n tokens with positive draft probability
    fixed_num_drafts: int | None = None

    def check_num_drafts(self, num_drafts: int, draft_probs: np.ndarray | None = None) -> None:
        """Raise ValueError when ``num_drafts`` is not valid for this scheme (and rows)."""
        if isinstance(num_drafts, bool) or not isinstance(num_drafts, (int, np.integer)):
            raise ValueError(f"num_drafts: expected an integer, got {num_drafts!r}")
        if num_drafts < 1:
            raise ValueError(f"num_drafts: must be at least 1, got {num_drafts}")
        if self.fixed_num_drafts is not None and num_drafts != self.fixed_num_drafts:
            raise ValueError(
                f"num_drafts: the {self.name} scheme is defined for n = "
                f"{self.fixed_num_drafts} only, got {num_drafts}"
            )
        if self.needs_distinct_support and draft_probs is not None:
            smallest = int(support_size(draft_probs).min())
            if num_drafts > smallest:
                raise ValueError(
                    f"num_drafts: {num_drafts} distinct drafts requested but a draft_probs row "
                    f"has only {smallest} tokens with positive probability ({self.name})"
                )

    def sample(self, draft_probs, num_drafts: int, rng: np.random.Generator) -> np.ndarray:
        """Draw draft tokens.  # draft_probs [batch, vocab] -> [batch, num_drafts] int64"""
        draft = as_distributions("draft_probs", draft_probs)
        self.check_num_drafts(num_drafts, draft)
        return self.sample_rows(draft, num_drafts, rng)

    def sample_torch(self, draft_probs, num_drafts: int, generator):
        """Torch twin of ``sample`` (see ``specbound.drafts_torch``).
        # draft_probs [batch, vocab] tensor -> [batch, num_drafts] long"""
        from specbound.drafts_torch import SAMPLERS

        if draft_probs.ndim != 2:
            raise ValueError(f"draft_probs: expected [batch, vocab], got {tuple(draft_probs.shape)}")
        self.check_num_drafts(num_drafts)
        if self.needs_distinct_support:
            smallest = int((draft_probs > 0).sum(dim=-1).min())
            if num_drafts > smallest:
                raise ValueError(
                    f"num_drafts: {num_drafts} distinct drafts requested but a draft_probs row "
                    f"has only {smallest} tokens with positive probability ({self.name})"
                )
        return SAMPLERS[self.name](draft_probs, num_drafts, generator)

    def joint_law(
        self, draft_probs, num_drafts: int, max_tuples: int = MAX_ENUMERATED_TUPLES
    ) -> tuple[np.ndarray, np.ndarray]:
        """Exact law of the draft tuple of one row: (tuples [K, n], probabilities [K]).

        Refuses, before enumerating, when support^n exceeds ``max_tuples``."""
        draft = as_distributions("draft_probs", draft_probs)
        if draft.shape[0] != 1:
            raise ValueError(f"draft_probs: joint_law takes one row, got {draft.shape[0]}")
        self.check_num_drafts(num_drafts, draft)
        support = int(support_size(draft)[0])
        if support**num_drafts > max_tuples:
            raise ValueError(
                f"num_drafts: enumerating {support}^{num_drafts} draft tuples exceeds "
                f"{max_tuples:,}; joint_law is for small vocabularies"
            )
        return self.enumerate_row(draft[0], num_drafts)


def top_tokens(draft_probs: np.ndarray, count: int) -> np.ndarray:
    """The ``count`` most probable tokens per row, most probable first, ties to the lower
    id. O(V) per row: a partition finds the count-th largest value, ties at it are
    filled in id order.  # [batch, vocab] -> [batch, count]"""
    if count == 0:
        return np.zeros((draft_probs.shape[0], 0), dtype=np.int64)
    vocab = draft_probs.shape[-1]
    kth = np.partition(draft_probs, vocab - count, axis=-1)[:, vocab - count, None]
    above, tied = draft_probs > kth, draft_probs == kth
    needed = count - above.sum(axis=-1, keepdims=True)
    chosen = above | (tied & (np.cumsum(tied, axis=-1) <= needed))
    tokens = np.nonzero(chosen)[1].reshape(-1, count)  # id order within each row
    order = np.argsort(-np.take_along_axis(draft_probs, tokens, axis=-1), axis=-1, kind="stable")
    return np.take_along_axis(tokens, order, axis=-1)


def _without(draft_probs: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Copy of ``draft_probs`` with ``tokens`` [batch, k] set to zero (unnormalised)."""
    remaining = draft_probs.copy()
    np.put_along_axis(remaining, tokens, 0.0, axis=-1)
    return remaining


def _sample_with_replacement(draft, num_drafts, rng):
    uniforms = rng.random((draft.shape[0], num_drafts))
    columns = [sample_from(draft, uniforms[:, i]) for i in range(num_drafts)]
    return np.stack(columns, axis=1)


def _sample_without_replacement(draft, num_drafts, rng):
    # Exponential race: E_x / q(x) with E_x ~ Exp(1); arrival order = sequential sampling
    # without replacement. Zero-probability tokens never arrive.
    with np.errstate(divide="ignore"):
        arrival = rng.standard_exponential(draft.shape) / draft
    return np.argsort(arrival, axis=-1, kind="stable")[:, :num_drafts]


def _sample_greedy(draft, num_drafts, rng):
    top = top_tokens(draft, num_drafts - 1)
    last = sample_from(_without(draft, top), rng.random(draft.shape[0]))
    return np.concatenate([top, last[:, None]], axis=1)


def _sample_spechub(draft, num_drafts, rng):
    hub = top_tokens(draft, 1)
    first = sample_from(draft, rng.random(draft.shape[0]))
    other = sample_from(_without(draft, hub), rng.random(draft.shape[0]))
    second = np.where(first == hub[:, 0], other, hub[:, 0])
    return np.stack([first, second], axis=1)


def _support(draft_row: np.ndarray) -> list[int]:
    return [int(token) for token in np.flatnonzero(draft_row > 0)]


def _enumerate_with_replacement(draft_row, num_drafts):
    tuples = list(itertools.product(_support(draft_row), repeat=num_drafts))
    probs = [float(np.prod(draft_row[list(t)])) for t in tuples]
    return np.array(tuples, dtype=np.int64), np.array(probs)


def _enumerate_without_replacement(draft_row, num_drafts):
    tuples = list(itertools.permutations(_support(draft_row), num_drafts))
    probs = []
    for draft_tuple in tuples:
        prob, unused = 1.0, draft_row > 0
        for token in draft_tuple:
            # the unused mass summed directly: 1 − used loses digits next to a dominant token
            prob *= draft_row[token] / draft_row[unused].sum()
            unused[token] = False
        probs.append(prob)
    return np.array(tuples, dtype=np.int64), np.array(probs)


def _enumerate_greedy(draft_row, num_drafts):
    top = top_tokens(draft_row[None, :], num_drafts - 1)[0]
    lasts = [token for token in _support(draft_row) if token not in set(top.tolist())]
    rest_mass = draft_row[lasts].sum()  # = 1 − q(T), without cancellation
    tuples = [tuple(top.tolist()) + (token,) for token in lasts]
    probs = [draft_row[token] / rest_mass for token in lasts]
    return np.array(tuples, dtype=np.int64).reshape(len(tuples), num_drafts), np.array(probs)


def _enumerate_spechub(draft_row, num_drafts):
    hub = int(top_tokens(draft_row[None, :], 1)[0, 0])
    others = [token for token in _support(draft_row) if token != hub]
    others_mass = draft_row[others].sum()  # = 1 − q(hub), without cancellation
    tuples, probs = [], []
    for token in others:
        tuples += [(hub, token), (token, hub)]
        probs += [draft_row[hub] * draft_row[token] / others_mass, draft_row[token]]
    return np.array(tuples, dtype=np.int64), np.array(probs)


DRAFT_SCHEMES: dict[str, DraftScheme] = {
    scheme.name: scheme
    for scheme in [
        DraftScheme(
            "with_replacement",
            "n i.i.d. draws from q",
            _sample_with_replacement,
            _enumerate_with_replacement,
            needs_distinct_support=False,
        ),
        DraftScheme(
            "without_replacement",
            "n sequential draws from q, each renormalised over unused tokens",
            _sample_without_replacement,
            _enumerate_without_replacement,
            needs_distinct_support=True,
        ),
        DraftScheme(
            "greedy",
            "the n-1 most probable tokens of q, then one draw from q over the rest [HU]",
            _sample_greedy,
            _enumerate_greedy,
            needs_distinct_support=True,
        ),
        DraftScheme(
            "spechub",
            "first ~ q; second = hub argmax q, or ~ q(.|not hub) if first is the hub [SPECHUB]",
            _sample_spechub,
            _enumerate_spechub,
            needs_distinct_support=True,
            fixed_num_drafts=2,
        ),
    ]
}


def get_draft_scheme(name: str) -> DraftScheme:
    """Look a draft scheme up by name, with a clear error for an unknown one."""
    try:
        return DRAFT_SCHEMES[name]
    except KeyError:
        raise ValueError(
            f"scheme: unknown draft scheme {name!r}; choose one of {sorted(DRAFT_SCHEMES)}"
        ) from None
