"""A draft scheme: how n draft tokens are proposed from one draft distribution q (SPEC.md §4.1),
and the one registry that holds every scheme.

Each scheme is one class in this package holding, side by side,
- its numpy sampler and its torch sampler (the engine's), with the same law and the same
  tie-breaking (towards the lower token id) — the hub of SpecHub, the top set of greedy;
- its exact joint law D(x1..xn) of one row, enumerated over the draft's support (small
  vocabularies: tests, the LP, the optimal verifier);
- its optimal acceptance α*(p, D) with the certificate H* (SPEC.md §4.2): by default the
  prefix scan (``specbound.bounds.subset``) fed with the scheme's own Q(H) on prefixes.

Letters: q = draft, p = target (SPEC.md §0). Register a new scheme with
``@register_scheme``; every caller (verifiers, engine, studies, command line) looks schemes
up here.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from specbound.bounds import MAX_LP_VARIABLES, OptimalAcceptance, bruteforce_optimum, optimal_coupling, prefix_scan_optimum
from specbound.bounds.rows import RowPairs
from specbound.checks import WorkLimitError, positive_int
from specbound.probability import as_distributions, as_target_and_draft, is_tensor, support_size

if TYPE_CHECKING:
    import torch

MAX_ENUMERATED_TUPLES = 2_000_000


class DraftScheme:
    """Base class; subclasses set the class attributes and the ``_sample*`` / ``_enumerate``
    hooks, and either ``_all_in_mass`` (Q on the scan-order prefixes) or ``_optimum``."""

    name: ClassVar[str]
    label: ClassVar[str]  # for tables: "with replacement", ...
    description: ClassVar[str]
    needs_distinct_support: ClassVar[bool]  # n drafts need n tokens of positive probability
    fixed_num_drafts: ClassVar[int | None] = None

    # -- the number of drafts -----------------------------------------------------------
    def check_num_drafts(self, num_drafts, draft_probs: np.ndarray | None = None, support=None) -> int:
        """Raise ValueError when ``num_drafts`` is not valid for this scheme (and rows, or
        their ``support`` when it is known: tokens of positive draft probability [batch])."""
        positive_int("num_drafts", num_drafts)
        if self.fixed_num_drafts is not None and num_drafts != self.fixed_num_drafts:
            raise ValueError(
                f"num_drafts: the {self.name} scheme is defined for n = "
                f"{self.fixed_num_drafts} only, got {num_drafts}"
            )
        if support is None and draft_probs is not None:
            support = _support(draft_probs)
        if self.needs_distinct_support and support is not None:
            smallest = int(np.min(support))
            if num_drafts > smallest:
                raise ValueError(
                    f"num_drafts: {num_drafts} distinct drafts requested but a draft_probs row "
                    f"has only {smallest} tokens with positive probability ({self.name})"
                )
        return int(num_drafts)

    def effective_num_drafts(self, num_drafts: int, support) -> int:
        """The drafts a node actually gets: a scheme of distinct tokens takes at most as
        many as its draft law has tokens of positive probability (at temperature 0, one).
        The count is a function of q alone, so every verifier stays lossless with it.
        The engine, the studies and the command line all follow this one rule.
        # support: int or [rows] -> same shape"""
        counts = np.minimum(num_drafts, support) if self.needs_distinct_support else np.full(np.shape(support), num_drafts)
        return int(counts) if np.ndim(counts) == 0 else counts

    def for_num_drafts(self, num_drafts: int) -> DraftScheme:
        """The scheme that draws ``num_drafts`` tokens: one draft is one draw from q under
        every scheme, so a single draft is drawn as with replacement (the same random
        numbers whatever the scheme, and defined for fixed-count schemes too)."""
        return DRAFT_SCHEMES["with_replacement"] if num_drafts == 1 else self

    # -- sampling ------------------------------------------------------------------------
    def sample(self, draft_probs, num_drafts: int, rng: np.random.Generator) -> np.ndarray:
        """Draw draft tokens.  # draft_probs [batch, vocab] -> [batch, num_drafts] int64"""
        draft = as_distributions("draft_probs", draft_probs)
        self.check_num_drafts(num_drafts, draft)
        return self._sample(draft, num_drafts, rng)

    def sample_torch(self, draft_probs: torch.Tensor, num_drafts: int, generator: torch.Generator):
        """Torch twin of ``sample``, for the engine; the rows are trusted to be probability
        rows (the engine's one processing step makes them), the count is checked.
        # draft_probs [batch, vocab] tensor -> [batch, num_drafts] long"""
        if draft_probs.ndim != 2:
            raise ValueError(f"draft_probs: expected [batch, vocab], got {tuple(draft_probs.shape)}")
        self.check_num_drafts(num_drafts, draft_probs)
        return self._sample_torch(draft_probs, num_drafts, generator)

    # -- the exact joint law and the optimum --------------------------------------------
    def joint_law(self, draft_probs, num_drafts: int, lp_vocab_size: int | None = None):
        """Exact law of the draft tuple of one row: (tuples [K, n], probabilities [K]).

        Refuses (``checks.WorkLimitError``), before enumerating, when the support^n tuples
        (support: the draft's tokens of positive probability) are more than
        ``MAX_ENUMERATED_TUPLES``, or, when the law feeds the coupling LP against
        ``lp_vocab_size`` = V target tokens (``bounds.coupling``: tuples × V variables), when
        the LP would have more than ``MAX_LP_VARIABLES`` variables."""
        draft = as_distributions("draft_probs", draft_probs)
        if draft.shape[0] != 1:
            raise ValueError(f"draft_probs: joint_law takes one row, got {draft.shape[0]}")
        self.check_num_drafts(num_drafts, draft)
        support = int(support_size(draft)[0])
        if lp_vocab_size is None:
            _within_tuple_limit(support, num_drafts)
        else:
            _within_lp_limit(support, num_drafts, lp_vocab_size)
        return self._enumerate(draft[0], num_drafts)

    def optimum(self, target_probs, draft_probs, num_drafts: int) -> OptimalAcceptance:
        """Exact α* and its certificate H*, batched, at any vocabulary size (SPEC.md §4.2).
        # target_probs, draft_probs [batch, vocab] -> OptimalAcceptance ([batch], [batch, vocab])"""
        return self.optimum_of(RowPairs.checked(target_probs, draft_probs), num_drafts)

    def optimum_of(self, rows: RowPairs, num_drafts: int) -> OptimalAcceptance:
        """``optimum`` of checked rows, reading their shared sorts and searches (``bounds.rows``)
        instead of computing its own.  # rows [batch, vocab] -> OptimalAcceptance"""
        self.check_num_drafts(num_drafts, support=rows.support)
        return self._optimum(rows, num_drafts)

    def optimum_lp(self, target_probs, draft_probs, num_drafts: int) -> np.ndarray:
        """α* per row from the coupling LP on this scheme's exact joint law (small V only).
        # target_probs, draft_probs [batch, vocab] -> [batch]"""
        target, draft = self._checked(target_probs, draft_probs, num_drafts)
        acceptance = []
        for target_row, draft_row in zip(target, draft):
            tuples, tuple_probs = self.joint_law(draft_row, num_drafts, lp_vocab_size=target.shape[1])
            acceptance.append(optimal_coupling(target_row, tuples, tuple_probs)[1])
        return np.array(acceptance)

    def optimum_bruteforce(self, target_probs, draft_probs, num_drafts: int) -> OptimalAcceptance:
        """α* and H* over all 2^V subsets (``bounds.subset.bruteforce_optimum``), tiny V only.
        # target_probs, draft_probs [batch, vocab] -> OptimalAcceptance"""
        target, draft = self._checked(target_probs, draft_probs, num_drafts)
        results = [bruteforce_optimum(target_row, *self.joint_law(draft_row, num_drafts))
                   for target_row, draft_row in zip(target, draft)]
        return OptimalAcceptance(np.array([a for a, _ in results]), np.array([h for _, h in results]))

    # -- hooks ---------------------------------------------------------------------------
    def _checked(self, target_probs, draft_probs, num_drafts):
        target, draft = as_target_and_draft(target_probs, draft_probs)
        self.check_num_drafts(num_drafts, draft)
        return target, draft

    def _optimum(self, rows: RowPairs, num_drafts) -> OptimalAcceptance:
        return prefix_scan_optimum(rows, lambda ordered: self.all_in_mass(ordered, num_drafts))

    def all_in_mass(self, draft_in_order: np.ndarray, num_drafts: int) -> np.ndarray:
        """Q(H_k) = P(all n drafts ∈ H_k) for every prefix H_k of the given order, k = 0..V
        (``draft_in_order``: q permuted into that order, unchecked).
        # [rows, vocab] -> [rows, vocab + 1]"""
        raise ValueError(f"scheme: {self.name} has no prefix formula for Q(H); its optimum is a closed form")

    def _sample(self, draft, num_drafts, rng) -> np.ndarray:
        raise NotImplementedError

    def _sample_torch(self, draft_probs, num_drafts, generator):
        raise NotImplementedError

    def _enumerate(self, draft_row, num_drafts) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError


def _support(draft_probs) -> np.ndarray:
    if is_tensor(draft_probs):
        return (draft_probs > 0).sum(dim=-1).cpu().numpy()
    return support_size(draft_probs)


def support_tokens(draft_row: np.ndarray) -> list[int]:
    """Token ids of positive draft probability, in id order.  # [vocab] -> list"""
    return [int(token) for token in np.flatnonzero(draft_row > 0)]


DRAFT_SCHEMES: dict[str, DraftScheme] = {}


def register_scheme(scheme_class: type[DraftScheme]) -> type[DraftScheme]:
    """Class decorator: add one instance of the scheme to ``DRAFT_SCHEMES`` under its name."""
    if scheme_class.name in DRAFT_SCHEMES:
        raise ValueError(f"scheme: {scheme_class.name!r} is registered already")
    DRAFT_SCHEMES[scheme_class.name] = scheme_class()
    return scheme_class


def get_draft_scheme(name: str) -> DraftScheme:
    """Look a draft scheme up by name, with a clear error for an unknown one."""
    try:
        return DRAFT_SCHEMES[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"scheme: unknown draft scheme {name!r}; choose one of {sorted(DRAFT_SCHEMES)}"
        ) from None


# -- how many tuples an exact law may list ------------------------------------------------
def _within_tuple_limit(support: int, num_drafts: int) -> None:
    """Refuse an exact joint law of more than MAX_ENUMERATED_TUPLES tuples (support^n)."""
    if _fits(support, num_drafts, 1, MAX_ENUMERATED_TUPLES):
        return
    raise WorkLimitError(
        f"num_drafts: the exact law of n = {num_drafts:,} drafts lists every tuple of them, "
        f"{support:,}^{num_drafts:,} {_power(support, num_drafts, 1)} tuples of the draft's {_tokens(support)} "
        f"of positive probability, above the limit of {MAX_ENUMERATED_TUPLES:,} tuples; it is for "
        f"small vocabularies: {_what_fits(support, num_drafts, 1, MAX_ENUMERATED_TUPLES)}")


def _within_lp_limit(support: int, num_drafts: int, vocab_size: int) -> None:
    """Refuse a coupling LP of more than MAX_LP_VARIABLES variables (support^n tuples × V),
    the limit stated as ``cli.decoding.check_enumeration`` states it before a model loads."""
    if _fits(support, num_drafts, vocab_size, MAX_LP_VARIABLES):
        return
    raise WorkLimitError(
        f"num_drafts: the optimal verifier (and α* by LP) solves a linear program over every tuple of "
        f"n = {num_drafts:,} drafts and every token of the vocabulary (tuples × V variables, at most "
        f"{MAX_LP_VARIABLES:,}); {support:,}^{num_drafts:,} tuples of the draft's {_tokens(support)} of positive "
        f"probability × V = {vocab_size:,} tokens {_power(support, num_drafts, vocab_size)} variables: "
        f"{_what_fits(support, num_drafts, vocab_size, MAX_LP_VARIABLES, 'another verifier')}")


def _fits(support: int, num_drafts: int, factor: int, limit: int) -> bool:
    """support^n × factor ≤ limit, exactly, without computing a huge power."""
    if support > 1 and num_drafts * math.log10(support) > math.log10(limit):
        return False
    return support**num_drafts * factor <= limit


def _what_fits(support: int, num_drafts: int, factor: int, limit: int, otherwise: str = "") -> str:
    """What brings support^n × factor within the limit: fewer drafts, or a draft with fewer
    tokens of positive probability (a lower --top-k); and ``otherwise``."""
    if factor > limit:
        return f"V = {factor:,} alone is above the limit" + (f"; use {otherwise}" if otherwise else "")
    options = []
    most_drafts = int(math.log(limit / factor) / math.log(support)) + 1  # support ≥ 2 here, or it fits
    while most_drafts and not _fits(support, most_drafts, factor, limit):
        most_drafts -= 1
    if most_drafts:
        options.append(f"n ≤ {most_drafts:,}")
    most_tokens = int((limit / factor) ** (1 / num_drafts)) + 1
    while most_tokens > 1 and not _fits(most_tokens, num_drafts, factor, limit):
        most_tokens -= 1
    if most_tokens > 1:
        options.append(f"at n = {num_drafts:,} a draft of at most {most_tokens:,} tokens of positive probability")
    options += [otherwise] if otherwise else []
    return "use " + ", or ".join(options)


def _tokens(count: int) -> str:
    return f"{count:,} token" + "s" * (count != 1)


def _power(support: int, num_drafts: int, factor: int) -> str:
    """support^n × factor: exactly below 10^7 (= 1,048,576), else in two figures (≈ 2.8e41)."""
    log10 = num_drafts * math.log10(support) + math.log10(factor)
    if log10 < 7:
        return f"= {support**num_drafts * factor:,}"
    exponent = math.floor(log10)
    return f"≈ {10 ** (log10 - exponent):.2g}e{exponent}"
