"""The optimal (LP) verifier: refused by the LP's time estimate before HiGHS starts, and a
draft tuple its scheme never draws is a ValueError naming the argument, not a KeyError."""

import numpy as np
import pytest
import scipy.optimize

from specbound.bounds.coupling import LP_SECONDS_LIMIT, lp_seconds
from specbound.checks import WorkLimitError
from specbound.verifiers import get_verifier

TARGET, DRAFT = [0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4]  # SPEC.md §4.4, fixture A


def test_the_lp_beyond_its_time_estimate_is_refused_before_it_is_solved(monkeypatch):
    """Fixture A at n = 8: 262,144 variables, under MAX_LP_VARIABLES, minutes of HiGHS.
    Refused by the estimate: no LP is handed to the solver."""
    assert lp_seconds(4**8, 4) > LP_SECONDS_LIMIT >= lp_seconds(4**6, 4)
    solves = []
    monkeypatch.setattr(scipy.optimize, "linprog", lambda *args, **kwargs: solves.append(args))
    with pytest.raises(WorkLimitError, match="draft_tuples: the coupling LP with 65,536 × 4 variables"):
        get_verifier("optimal").acceptance_rate(TARGET, DRAFT, 8)
    assert solves == []


@pytest.mark.parametrize("scheme", ["greedy", "spechub"])
def test_a_tuple_the_scheme_never_draws_is_refused_naming_the_draft_tokens(scheme):
    """Greedy and SpecHub drafts start with the most probable token (3 here): (0, 1) has
    probability 0 and its lookup used to end in a KeyError."""
    verifier = get_verifier("optimal", draft_scheme=scheme)
    with pytest.raises(ValueError, match=r"draft_tokens: the .* draft scheme never draws the tuple \(0, 1\)"):
        verifier.verify(TARGET, DRAFT, [[0, 1]], np.random.default_rng(0))
    with pytest.raises(ValueError, match="draft_tokens"):
        verifier.output_law(TARGET, DRAFT, [[0, 1]])
