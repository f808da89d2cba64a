"""A checked batch of (target, draft) row pairs and what the closed forms compute from it,
each at most once: the support of the draft, the scan order by p/q with the target and the
draft in it and their running sums, the draft's most probable tokens. Every α* and verifier that
reads one of these takes it from here, so a study scoring many methods at one row checks,
sorts and searches the row once (``DraftScheme.optimum_of``, ``Verifier.acceptance_rate_of``).

Letters: p = target, q = draft (SPEC.md §0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from specbound.bounds.subset import in_order, prefix_sums, scan_order
from specbound.probability import as_target_and_draft, support_size, top_tokens


@dataclass(frozen=True, eq=False)
class RowPairs:
    """Checked rows (``checked``: renormalised once by ``probability.as_target_and_draft``)
    and their shared quantities, computed on first use. ``scan_guess``: an order likely to
    be the scan order (e.g. a wider tail cut's, restricted), which ``subset.scan_order``
    checks and takes where it is.  # target, draft [batch, vocab]"""

    target: np.ndarray  # [batch, vocab]
    draft: np.ndarray  # [batch, vocab]
    scan_guess: np.ndarray | None = field(default=None, repr=False)  # [batch, vocab] int
    _top: dict = field(default_factory=dict, repr=False)

    @classmethod
    def checked(cls, target_probs, draft_probs, scan_guess=None) -> RowPairs:
        return cls(*as_target_and_draft(target_probs, draft_probs), scan_guess)

    def select(self, rows) -> RowPairs:
        """The rows ``rows`` (a mask or indices), already checked.  # -> [selected, vocab]"""
        return RowPairs(self.target[rows], self.draft[rows], None if self.scan_guess is None else self.scan_guess[rows])

    @cached_property
    def support(self) -> np.ndarray:
        """Draft tokens of positive probability per row.  # [batch]"""
        return support_size(self.draft)

    @cached_property
    def scan_order(self) -> np.ndarray:
        """Tokens by p/q ascending (``subset.scan_order``).  # [batch, vocab]"""
        return scan_order(self.target, self.draft, self.scan_guess)

    @cached_property
    def draft_in_scan_order(self) -> np.ndarray:
        """q permuted into the scan order.  # [batch, vocab]"""
        return in_order(self.draft, self.scan_order)

    @cached_property
    def target_in_scan_order(self) -> np.ndarray:
        """p permuted into the scan order.  # [batch, vocab]"""
        return in_order(self.target, self.scan_order)

    @cached_property
    def target_inside(self) -> np.ndarray:
        """p(H_k) on every prefix H_k of the scan order, k = 0..V.  # [batch, vocab + 1]"""
        return prefix_sums(self.target_in_scan_order)

    @cached_property
    def draft_inside(self) -> np.ndarray:
        """q(H_k) on every prefix H_k of the scan order, k = 0..V.  # [batch, vocab + 1]"""
        return prefix_sums(self.draft_in_scan_order)

    def top(self, count: int) -> np.ndarray:
        """The ``count`` most probable draft tokens (``probability.top_tokens``).  # [batch, count]"""
        if count not in self._top:
            self._top[count] = top_tokens(self.draft, count)
        return self._top[count]
