"""Draft schemes (SPEC.md §4.1): the one registry, each scheme's samplers, joint law and α*.

``get_draft_scheme(name)`` returns a ``DraftScheme``; ``DRAFT_SCHEMES`` lists them all:
with_replacement, without_replacement, greedy, spechub. ``optimal_acceptance`` is α* of a
scheme by name (SPEC.md §4.2).
"""

from specbound.bounds import OptimalAcceptance
from specbound.drafts import with_replacement, without_replacement, greedy  # noqa: F401, I001  (registration, in this order)
from specbound.drafts.base import DRAFT_SCHEMES, DraftScheme, get_draft_scheme, register_scheme


def optimal_acceptance(target_probs, draft_probs, num_drafts: int, scheme: str) -> OptimalAcceptance:
    """Exact α* and its certificate H* of the draft scheme ``scheme`` (SPEC.md §4.2, [HU]):
    the prefix scan or the scheme's closed form, batched, at any vocabulary size.
    # target_probs, draft_probs [batch, vocab] -> OptimalAcceptance ([batch], [batch, vocab])"""
    return get_draft_scheme(scheme).optimum(target_probs, draft_probs, num_drafts)


def optimal_acceptance_lp(target_probs, draft_probs, num_drafts: int, scheme: str):
    """α* per row from the coupling LP on the scheme's exact joint law (small V only).  # -> [batch]"""
    return get_draft_scheme(scheme).optimum_lp(target_probs, draft_probs, num_drafts)


def optimal_acceptance_bruteforce(target_probs, draft_probs, num_drafts: int, scheme: str) -> OptimalAcceptance:
    """α* and H* over all 2^V subsets, from the enumerated joint law (tiny V only)."""
    return get_draft_scheme(scheme).optimum_bruteforce(target_probs, draft_probs, num_drafts)


__all__ = ["DRAFT_SCHEMES", "DraftScheme", "get_draft_scheme", "optimal_acceptance", "optimal_acceptance_bruteforce",
           "optimal_acceptance_lp", "register_scheme"]
