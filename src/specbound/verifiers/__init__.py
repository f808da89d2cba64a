"""Verifiers of speculative decoding, one registry looked up by name (SPEC.md §1, §3, §4.3).

``get_verifier(name, **parameters)`` returns a ``Verifier``; ``VERIFIERS`` maps every
registered name to its class: single, rrs, rrs_without_replacement (``rrs``), kseq
(``kseq``), greedy and spechub (``greedy``), optimal (``optimal``), decoding_opt and
decoding_uno (``biased``, with the Pareto front of [YIN] §4), global_resolution
(``global_resolution``, the optimal verifier of i.i.d. drafts at any size); then block, traversal and univer
(``block``, ``traversal``, ``univer``), which decide on a whole drafted tree (``tree``: ``ScoredTree``,
``TreeVerifier``, ``per_node = False``; SPEC.md §7). ``enumeration`` holds the exact laws of
a drafted step for small vocabularies (``TreeDrafter``, ``SequenceLaws``) and, on them, the
multi-step optimum the tree verifiers are compared with (SPEC.md §7.4); it is not imported here.
"""

from specbound.verifiers import rrs, kseq, greedy, optimal, biased  # noqa: F401, I001  (registration, in this order)
from specbound.verifiers import global_resolution  # noqa: F401, I001  (registration, after optimal's kin)
from specbound.verifiers import block, traversal, univer  # noqa: F401, I001  (registration, after the per-node ones)
from specbound.verifiers.base import VERIFIERS, Verdict, Verifier, get_verifier, register_verifier
from specbound.verifiers.tree import ScoredTree, TreeVerdict, TreeVerifier

__all__ = ["VERIFIERS", "ScoredTree", "TreeVerdict", "TreeVerifier", "Verdict", "Verifier", "get_verifier",
           "register_verifier"]
