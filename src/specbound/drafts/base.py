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

from typing import ClassVar

import numpy as np
import torch

from specbound.bounds import MAX_LP_VARIABLES, OptimalAcceptance, bruteforce_optimum, optimal_coupling, prefix_scan_optimum
from specbound.checks import positive_int
from specbound.probability import as_distributions, as_target_and_draft, support_size

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
    def check_num_drafts(self, num_drafts, draft_probs: np.ndarray | None = None) -> int:
        """Raise ValueError when ``num_drafts`` is not valid for this scheme (and rows)."""
        positive_int("num_drafts", num_drafts)
        if self.fixed_num_drafts is not None and num_drafts != self.fixed_num_drafts:
            raise ValueError(
                f"num_drafts: the {self.name} scheme is defined for n = "
                f"{self.fixed_num_drafts} only, got {num_drafts}"
            )
        if self.needs_distinct_support and draft_probs is not None:
            smallest = int(_support(draft_probs).min())
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
    def joint_law(self, draft_probs, num_drafts: int, max_tuples: int = MAX_ENUMERATED_TUPLES):
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
        return self._enumerate(draft[0], num_drafts)

    def optimum(self, target_probs, draft_probs, num_drafts: int) -> OptimalAcceptance:
        """Exact α* and its certificate H*, batched, at any vocabulary size (SPEC.md §4.2).
        # target_probs, draft_probs [batch, vocab] -> OptimalAcceptance ([batch], [batch, vocab])"""
        target, draft = self._checked(target_probs, draft_probs, num_drafts)
        return self._optimum(target, draft, num_drafts)

    def optimum_lp(self, target_probs, draft_probs, num_drafts: int) -> np.ndarray:
        """α* per row from the coupling LP on this scheme's exact joint law (small V only).
        # target_probs, draft_probs [batch, vocab] -> [batch]"""
        target, draft = self._checked(target_probs, draft_probs, num_drafts)
        acceptance = []
        for target_row, draft_row in zip(target, draft):
            tuples, tuple_probs = self.joint_law(
                draft_row, num_drafts, max_tuples=MAX_LP_VARIABLES // target.shape[1]
            )
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

    def _optimum(self, target, draft, num_drafts) -> OptimalAcceptance:
        return prefix_scan_optimum(target, draft, lambda ordered: self.all_in_mass(ordered, num_drafts))

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
    if isinstance(draft_probs, torch.Tensor):
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
