"""The study's exact pass checks and sorts each row once (``bounds.rows.RowPairs``) and
hands that form to every method at every n: its values are each method's own computation
on the row, bit for bit, on edge cases (zeros, point masses, ties, tiny and dominant
tokens)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from support.edge_cases import distribution_pairs
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


def test_a_method_refused_by_estimate_is_computed_at_no_row(monkeypatch):
    """RRS without replacement at n = 4 refuses a row by its work estimate; a value computed
    at an earlier row would be thrown away, so every row is estimated before any is
    computed: no row computes it, and the reason is the refused row's own."""
    import specbound.verifiers.rrs as rrs

    rng = np.random.default_rng(3)
    agreeing = rng.dirichlet(np.ones(40))  # nothing to reject: the estimate lets it through
    refused = rng.dirichlet(np.ones(2000), size=2)  # ~1,000 rejectable tokens: ~200 s estimated
    pairs = [(agreeing, agreeing), (refused[0], refused[1]), (agreeing, agreeing)]
    reason = rrs.recursion_refusal(refused[0], refused[1], 4)
    assert reason is not None and rrs.recursion_refusal(agreeing, agreeing, 4) is None
    expected = own_computation("rrs_without_replacement", agreeing, agreeing, 4)
    computed = []
    original = rrs.rrs_without_replacement_acceptance
    monkeypatch.setattr(rrs, "rrs_without_replacement_acceptance",
                        lambda *args: computed.append(args) or original(*args))
    acceptance, missing = exact_acceptances(["rrs_without_replacement", "single"], pairs, 4)
    assert computed == [] and missing == {"rrs_without_replacement": reason}
    assert list(acceptance) == ["single"] and len(acceptance["single"]) == 3
    # where no row is refused, every row is computed, as the method alone computes it
    acceptance, missing = exact_acceptances(["rrs_without_replacement"], pairs[::2], 4)
    assert missing == {} and len(computed) == 2
    assert acceptance["rrs_without_replacement"] == [expected] * 2
    # deferred (the pool's first round): estimated at every row, computed at none
    acceptance, missing = exact_acceptances(["rrs_without_replacement", "single"], pairs[::2], 4, defer=True)
    assert missing == {"rrs_without_replacement": None} and list(acceptance) == ["single"] and len(computed) == 2
