"""The study's exact pass checks and sorts each row once (``bounds.rows.RowPairs``) and
hands that form to every method at every n: its values are each method's own computation
on the row, bit for bit, on edge cases (zeros, point masses, ties, tiny and dominant
tokens)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_cases import distribution_pairs
from specbound.probability import support_size
from specbound.studies.acceptance import exact_acceptances
from specbound.studies.acceptance_methods import acceptance_methods, attained_optimum

METHODS = acceptance_methods()
COUNTS = (2, 3, 4, 6)


def own_computation(method: str, target, draft, num_drafts: int):
    """The method alone on the row, through its public closed form: α* of its scheme, or
    its verifier's acceptance rate (None where it has no exact value)."""
    entry = METHODS[method]
    count = int(entry.scheme.effective_num_drafts(entry.count(num_drafts), support_size(draft[None])[0]))
    try:
        if entry.verifier is None:
            return entry.scheme.for_num_drafts(count).optimum(target[None], draft[None], count).acceptance[0]
        return entry.verifier.for_num_drafts(count).acceptance_rate(target[None], draft[None], count)[0]
    except ValueError:
        return None


def with_ties(row, levels: int):
    """The row rounded to multiples of 1/levels (most tokens then tie), renormalised; the
    largest token keeps the mass when everything rounds to 0."""
    tied = np.round(row * levels) / levels
    if tied.sum() == 0:
        tied[np.argmax(row)] = 1.0
    return tied / tied.sum()


@settings(max_examples=40, deadline=None)
@given(distribution_pairs(max_vocab=7), st.sampled_from((0, 2, 4)))
def test_the_shared_row_form_gives_every_methods_own_values(pair, levels):
    target, draft = pair if levels == 0 else (with_ties(pair[0], levels), with_ties(pair[1], levels))
    for num_drafts in COUNTS:
        acceptance, missing = exact_acceptances(list(METHODS), [(target, draft)], num_drafts)
        assert set(acceptance) | set(missing) == set(METHODS)
        for method in METHODS:
            source = attained_optimum(method, num_drafts) or method
            expected = own_computation(source, target, draft, num_drafts)
            if expected is None:
                assert method in missing
            else:
                assert acceptance[method][0] == expected, (method, num_drafts)


def test_a_method_refused_at_one_row_is_left_out_at_every_row():
    rows = np.random.default_rng(0).dirichlet(np.ones(60), size=(2, 2))
    acceptance, missing = exact_acceptances(["rrs_without_replacement", "single"],
                                            [(rows[0, 0], rows[0, 1]), (rows[1, 0], rows[1, 1])], 6)
    assert "rrs_without_replacement" in missing and list(acceptance) == ["single"]
    assert len(acceptance["single"]) == 2
