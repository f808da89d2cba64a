"""The methods of the acceptance study [HU] §5: the optimum α* of every registered draft
scheme, and every registered lossless per-node verifier whose exact acceptance scales to
real vocabularies, each with its number of drafts and the optimum it is compared with.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from specbound.bounds.rows import RowPairs
from specbound.drafts import DRAFT_SCHEMES, DraftScheme
from specbound.verifiers import VERIFIERS, Verifier

DEFAULT_TEMPERATURE = 0.7  # [HU]'s defaults, the headline of the tables
DEFAULT_NUM_DRAFTS = 3


@dataclass(frozen=True)
class AcceptanceMethod:
    """One row of the acceptance tables: the optimum α* of a draft scheme, or a verifier.

    ``count(n)`` is the number of drafts it is evaluated at when the study asks for n;
    ``bound`` names the optimum it is compared with (its draft scheme's α*), None for an
    optimum itself."""

    name: str
    label: str
    scheme: DraftScheme
    fixed_num_drafts: int | None
    verifier: Verifier | None = None

    @property
    def bound(self) -> str | None:
        return None if self.verifier is None else optimum_name(self.scheme)

    def count(self, num_drafts: int) -> int:
        return self.fixed_num_drafts or num_drafts

    def acceptance(self, target_rows, draft_rows, num_drafts: int) -> np.ndarray:
        """Exact acceptance with ``num_drafts`` drafts at every row, each row getting as
        many as its draft law allows (the engine's rule).
        # target_rows, draft_rows [positions, vocab] -> [positions]"""
        return self.acceptance_of(RowPairs.checked(target_rows, draft_rows), num_drafts)

    def acceptance_of(self, rows: RowPairs, num_drafts: int) -> np.ndarray:
        """``acceptance`` of checked rows, reading the sorts and searches they share with
        every other method (``bounds.rows``).  # rows [positions, vocab] -> [positions]"""
        counts = self.scheme.effective_num_drafts(num_drafts, rows.support)
        if np.all(counts == counts[0]):
            return self._at(rows, int(counts[0]))
        acceptance = np.empty(rows.draft.shape[0])
        for count in np.unique(counts):
            selected = counts == count
            acceptance[selected] = self._at(rows.select(selected), int(count))
        return acceptance

    def refuses_by_estimate(self, num_drafts: int) -> bool:
        """Whether a row can be refused at ``num_drafts`` by a work estimate (``refusal_of``)."""
        return self.verifier is not None and self.verifier.refuses_by_estimate(num_drafts)

    def refusal_of(self, rows: RowPairs, num_drafts: int) -> str | None:
        """Why ``acceptance_of`` would refuse the first of ``rows`` it refuses by a work
        estimate (``Verifier.refusal_by_estimate``, at each row's count of drafts), None
        where it refuses none so. # rows [positions, vocab]"""
        if self.verifier is None:
            return None
        for row, count in enumerate(self.scheme.effective_num_drafts(num_drafts, rows.support)):
            reason = self.verifier.for_num_drafts(int(count)).refusal_by_estimate(rows.target[row], rows.draft[row],
                                                                                  int(count))
            if reason is not None:
                return reason
        return None

    def _at(self, rows, count):
        if self.verifier is None:
            return self.scheme.for_num_drafts(count).optimum_of(rows, count).acceptance
        return self.verifier.for_num_drafts(count).acceptance_rate_of(rows, count)


def optimum_name(scheme: DraftScheme) -> str:
    return f"optimal_{scheme.name}"


def acceptance_methods() -> dict[str, AcceptanceMethod]:
    """The study's methods, from the registries: α* of every draft scheme, then every
    lossless per-node verifier whose exact acceptance scales to real vocabularies. Built
    once per state of the registries (the exact part asks for them about 30 times a
    position)."""
    return dict(_methods_of(tuple(DRAFT_SCHEMES.items()), tuple(VERIFIERS.items())))


@lru_cache(maxsize=4)
def _methods_of(schemes, verifiers) -> dict[str, AcceptanceMethod]:
    """``acceptance_methods`` of the registries' entries ``schemes`` and ``verifiers``
    ((name, entry) pairs); the callers copy the dict."""
    methods = {
        optimum_name(scheme): AcceptanceMethod(optimum_name(scheme), f"α* {scheme.label}", scheme,
                                               scheme.fixed_num_drafts)
        for _, scheme in schemes
    }
    for _, verifier_class in verifiers:
        if verifier_class.lossless and verifier_class.scalable and verifier_class.per_node:
            verifier = verifier_class()
            methods[verifier.name] = AcceptanceMethod(verifier.name, verifier.label, verifier.draft_scheme,
                                                      verifier.fixed_num_drafts, verifier)
    return methods


def method_label(name: str) -> str:
    """A method's table label (its name when it is no longer registered)."""
    method = acceptance_methods().get(name)
    return method.label if method else name


def method_acceptance(method: str, target_rows, draft_rows, num_drafts: int) -> np.ndarray:
    """Exact acceptance of ``method`` (a key of ``acceptance_methods``) asked for with
    ``num_drafts`` drafts, at every row.  # [positions, vocab] x2 -> [positions]"""
    return method_acceptance_of(method, RowPairs.checked(target_rows, draft_rows), num_drafts)


def method_acceptance_of(method: str, rows: RowPairs, num_drafts: int) -> np.ndarray:
    """``method_acceptance`` of checked rows, which every method at every n reads its sorts
    and searches from.  # rows [positions, vocab] -> [positions]"""
    methods = acceptance_methods()
    if method not in methods:
        raise ValueError(f"method: unknown method {method!r}; choose from {', '.join(methods)}")
    entry = methods[method]
    return entry.acceptance_of(rows, entry.count(num_drafts))


def method_refuses_by_estimate(method: str, num_drafts: int) -> bool:
    """``AcceptanceMethod.refuses_by_estimate`` of ``method`` asked for with ``num_drafts``
    drafts (False for an unknown method)."""
    entry = acceptance_methods().get(method)
    return entry is not None and entry.refuses_by_estimate(entry.count(num_drafts))


def method_refusal_of(method: str, rows: RowPairs, num_drafts: int) -> str | None:
    """``AcceptanceMethod.refusal_of`` of ``method`` asked for with ``num_drafts`` drafts."""
    entry = acceptance_methods()[method]
    return entry.refusal_of(rows, entry.count(num_drafts))


def attained_optimum(method: str, num_drafts: int) -> str | None:
    """The optimum whose values ``method`` has at n = ``num_drafts`` by construction (a
    verifier that attains its draft scheme's α*, e.g. greedy and SpecHub), else None."""
    entry = acceptance_methods().get(method)
    if entry is None or entry.verifier is None or not entry.verifier.attains_optimum:
        return None
    return bound_of(method, num_drafts)


def bound_of(method: str, num_drafts: int) -> str | None:
    """The optimum a method is compared with at n = ``num_drafts``: its draft scheme's α*,
    when both are evaluated at the same number of drafts (the single draft's α* is the
    one-draft optimum, not the study's n). None for an optimum or an unknown method."""
    methods = acceptance_methods()
    entry = methods.get(method)
    if entry is None or entry.bound is None or entry.bound not in methods:
        return None
    return entry.bound if methods[entry.bound].count(num_drafts) == entry.count(num_drafts) else None
