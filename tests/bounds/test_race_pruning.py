"""α* without replacement by the pruned prefix scan (specbound.bounds.race): the bounds on
Q(H) from the n = 2 closed form bracket the exact Q, the race on chosen prefixes equals
the race on every prefix, and the pruned optimum equals the full scan."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_cases import EXACT_KINDS, distribution_pairs
from specbound.bounds import prefix_scan_optimum
from specbound.bounds.race import RACE_ACCURACY, race_all_in_mass, race_mass_bounds
from specbound.bounds.rows import RowPairs
from specbound.drafts import get_draft_scheme
from test_optimal_acceptance import without_replacement_prefix_mass

WITHOUT = get_draft_scheme("without_replacement")


@st.composite
def vocabulary_rows(draw, max_vocab=300):
    """(target, draft) rows shaped like a model's: softmax of scaled normal logits (flat to
    a dominant token), optionally rounded to bfloat16-like 8-bit mantissas (many ties),
    with some exact zeros; the draft's logits are the target's plus noise."""
    vocab = draw(st.integers(8, max_vocab))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    logits = draw(st.sampled_from([0.5, 2.0, 5.0, 12.0])) * rng.standard_normal(vocab)
    rows = []
    for noise in (0.0, draw(st.sampled_from([0.1, 0.5, 2.0]))):
        row = np.exp(logits + noise * rng.standard_normal(vocab) - logits.max())
        if draw(st.booleans()):
            mantissa, exponent = np.frexp(row)
            row = np.ldexp(np.round(mantissa * 256) / 256, exponent)
        row[rng.random(vocab) < draw(st.sampled_from([0.0, 0.05]))] = 0.0
        row[0] += 1e-3
        rows.append(row / row.sum())
    return rows[0], rows[1]


@settings(max_examples=60, deadline=None)
@given(pair=distribution_pairs(max_vocab=7, kinds=EXACT_KINDS), num_drafts=st.integers(3, 5))
def test_mass_bounds_bracket_the_exact_all_in_mass(pair, num_drafts):
    """lower ≤ Q(H_k) ≤ upper on every prefix, Q by enumeration of the ordered draws."""
    _, draft = pair
    draft = draft / draft.sum()
    if np.count_nonzero(draft) < num_drafts:
        num_drafts = max(1, np.count_nonzero(draft))
    if num_drafts < 3:
        return
    exact = without_replacement_prefix_mass(draft, num_drafts)
    pairs = WITHOUT.all_in_mass(draft[None], 2)
    lower, upper = race_mass_bounds(draft[None], num_drafts, pairs)
    assert np.all(lower[0] <= exact + 1e-15)
    assert np.all(exact <= upper[0] + 1e-15)


@settings(max_examples=25, deadline=None)
@given(rows=vocabulary_rows(), num_drafts=st.sampled_from([3, 4, 6]), seed=st.integers(0, 2**16))
def test_race_on_chosen_prefixes_equals_the_race_on_all(rows, num_drafts, seed):
    _, draft = rows
    needed = np.random.default_rng(seed).random(draft.size + 1) < 0.05
    chosen = race_all_in_mass(draft, num_drafts, needed)
    every = race_all_in_mass(draft, num_drafts)
    np.testing.assert_allclose(chosen[needed], every[needed], rtol=0, atol=1e-13)
    assert np.all(np.isnan(chosen[~needed]))


@settings(max_examples=30, deadline=None)
@given(rows=vocabulary_rows(), num_drafts=st.sampled_from([3, 4, 6]))
def test_pruned_scan_equals_the_full_scan(rows, num_drafts):
    """The pruned α* equals the scan over every prefix (to the race's accuracy), and its
    certificate H* attains it."""
    target, draft = rows[0][None], rows[1][None]
    num_drafts = min(num_drafts, np.count_nonzero(draft))
    pruned = WITHOUT.optimum(target, draft, num_drafts)
    full = prefix_scan_optimum(RowPairs.checked(target, draft), lambda ordered: WITHOUT.all_in_mass(ordered, num_drafts))
    assert abs(pruned.acceptance[0] - full.acceptance[0]) <= 1e-13
    subset = pruned.optimal_subset[0]
    ordered = np.concatenate([draft[0][subset], draft[0][~subset]])  # H* is a prefix: its own order is free
    mass = race_all_in_mass(ordered, num_drafts)[subset.sum()]
    assert abs(1.0 + target[0][subset].sum() - mass - pruned.acceptance[0]) <= RACE_ACCURACY


def test_mass_bounds_are_tight_on_a_uniform_draft():
    """q uniform on H: every s_2 is 2/V, so at n = 3 both bounds are the exact Q (the
    upper by Jensen's equality case, the lower because T_2 = s_2)."""
    draft = np.full(6, 1.0 / 6.0)
    exact = without_replacement_prefix_mass(draft, 3)
    lower, upper = race_mass_bounds(draft[None], 3, WITHOUT.all_in_mass(draft[None], 2))
    np.testing.assert_allclose(lower[0], exact, rtol=0, atol=3e-12)
    np.testing.assert_allclose(upper[0], exact, rtol=0, atol=1e-10)  # m is lowered by 1e-10 of its sums
