"""The optimal multi-draft acceptance rate α* and the tools that compute it (SPEC.md §4.2, [HU]).

- ``coupling``: the optimal-transport LP itself, for an explicit joint law of the drafts;
- ``subset``: its dual, subset selection — brute force over all subsets, and the fast
  prefix scan in p/q order (q-convexity);
- ``race``: Q(H) for drafts drawn without replacement, n ≥ 3 (exponential race), and bounds
  on it that prune the prefix scan;
- ``tail``: the tail cut, with its proven bound on the move of Σ min(p, q) and of every α*.

Each draft scheme (``specbound.drafts``) applies these to its own law:
``get_draft_scheme(name).optimum(target_probs, draft_probs, num_drafts)``.
"""

from specbound.bounds.coupling import LP_TOLERANCE, MAX_LP_VARIABLES, optimal_coupling
from specbound.bounds.subset import OptimalAcceptance, bruteforce_optimum, prefix_scan_optimum, scan_order

__all__ = [
    "LP_TOLERANCE",
    "MAX_LP_VARIABLES",
    "OptimalAcceptance",
    "bruteforce_optimum",
    "optimal_coupling",
    "prefix_scan_optimum",
    "scan_order",
]
