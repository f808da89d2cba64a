"""α* without replacement by the pruned prefix scan (specbound.bounds.race): the bounds on
Q(H) from the n = 2 closed form bracket the exact Q, the race on chosen prefixes equals
the race on every prefix, and the pruned optimum equals the full scan."""

import warnings
from math import comb, perm

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.edge_cases import EXACT_KINDS, distribution_pairs
from support.instances import without_replacement_prefix_mass
from specbound.bounds import prefix_scan_optimum, race
from specbound.bounds.race import RACE_ACCURACY, race_all_in_mass, race_mass_bounds
from specbound.bounds.rows import RowPairs
from specbound.verifiers import get_verifier
from specbound.drafts import get_draft_scheme

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


@settings(max_examples=40, deadline=None)
@given(rows=vocabulary_rows(), num_drafts=st.sampled_from([3, 4, 6]), exact=st.booleans())
def test_fine_bounds_only_where_coarse_ones_leave_a_chance_keep_the_same_prefixes(rows, num_drafts, exact):
    """With p(H_k) the bounds are fine only where coarse ones cannot rule a prefix out: the
    prefix scan keeps exactly the prefixes it keeps with the fine bounds everywhere, and the
    mixed bounds still bracket Q (the race's, or on V ≤ 7 the enumeration's)."""
    from specbound.bounds.subset import can_minimise

    target, draft = rows
    if exact:  # small enough to enumerate the draws
        target, draft = target[:7] / target[:7].sum(), draft[:7] / draft[:7].sum()
    if np.count_nonzero(draft) < num_drafts:
        return
    checked = RowPairs.checked(target[None], draft[None])
    ordered, inside = checked.draft_in_scan_order, checked.target_inside
    pairs = WITHOUT.all_in_mass(ordered, 2)
    fine_lower, fine_upper = race_mass_bounds(ordered, num_drafts, pairs)
    lower, upper = race_mass_bounds(ordered, num_drafts, pairs, inside)
    np.testing.assert_array_equal(can_minimise(inside, lower, upper), can_minimise(inside, fine_lower, fine_upper))
    assert np.min(inside - lower) == np.min(inside - fine_lower)  # the scan's ceiling, bit for bit
    exact_mass = (without_replacement_prefix_mass(ordered[0], num_drafts) if exact
                  else race_all_in_mass(ordered[0], num_drafts))
    # the enumeration's own rounding: each draw's probability is n quotients of sums of ≤ V
    # masses (relative error ≤ n·(V + 2)·u, weighted by probabilities that sum to ≤ 1), and
    # summing the draws adds ≤ draws·u: 1.1e-15 seen at H = everything, where the bounds are 1
    vocab, draws = np.count_nonzero(draft), perm(np.count_nonzero(draft), num_drafts)
    tolerance = (num_drafts * (vocab + 2) + draws) * np.finfo(float).eps if exact else RACE_ACCURACY
    assert np.all(lower[0] <= exact_mass + tolerance) and np.all(exact_mass <= upper[0] + tolerance)


def test_mass_bounds_are_tight_on_a_uniform_draft():
    """q uniform on H: every s_2 is 2/V, so at n = 3 both bounds are the exact Q (the
    upper by Jensen's equality case, the lower because T_2 = s_2)."""
    draft = np.full(6, 1.0 / 6.0)
    exact = without_replacement_prefix_mass(draft, 3)
    lower, upper = race_mass_bounds(draft[None], 3, WITHOUT.all_in_mass(draft[None], 2))
    np.testing.assert_allclose(lower[0], exact, rtol=0, atol=3e-12)
    np.testing.assert_allclose(upper[0], exact, rtol=0, atol=1e-10)  # m is lowered by 1e-10 of its sums



def test_upper_mass_bound_is_jensens_on_the_power_of_the_third_draw_law():
    """q uniform on 12 tokens, n = 4: s_2 = 2/V always, and where 3r ≤ 2(1 − T_2) the upper
    bound is Q_2·f(2/V)² (f^{n−2} concave: Jensen with equality), not Q_2·f(2/V)·q(H)."""
    vocab, num_drafts = 12, 4
    draft = np.full(vocab, 1.0 / vocab)
    exact = without_replacement_prefix_mass(draft, num_drafts)
    pairs = WITHOUT.all_in_mass(draft[None], 2)
    _, upper = race_mass_bounds(draft[None], num_drafts, pairs)
    sizes = np.arange(vocab + 1)
    concave = (num_drafts - 1) * (vocab - sizes) <= 2 * (vocab - 2)
    checked = concave & (sizes >= num_drafts) & (sizes < vocab)
    third = (sizes - 2) / (vocab - 2)  # f(2/V) = (q(H) − 2/V)/(1 − 2/V)
    assert checked.sum() >= 4
    np.testing.assert_allclose(upper[0][checked], (pairs[0] * third**2)[checked], rtol=0, atol=1e-9)
    assert np.all(exact[checked] <= upper[0][checked])


def test_lower_mass_bound_is_the_chord_of_the_third_draw_law():
    """n = 3: Q ≥ Q_2·(q(H) − (q(H) − f(T_2))·m/T_2), f above its chord over [0, T_2] ∋ s_2,
    with m = E[s_2 | both in H] by enumerating the ordered pairs; f(T_2) alone is lower."""
    draft = np.array([0.05, 0.4, 0.05, 0.05, 0.1, 0.05, 0.05, 0.05, 0.2])
    exact = without_replacement_prefix_mass(draft, 3)
    lower, _ = race_mass_bounds(draft[None], 3, WITHOUT.all_in_mass(draft[None], 2))
    for size in range(3, draft.size):
        held = draft[:size]
        pairs = [(a, b) for a in range(size) for b in range(size) if a != b]
        pair_mass = sum(held[a] * held[b] / (1 - held[a]) for a, b in pairs)
        mean = sum(held[a] * held[b] / (1 - held[a]) * (held[a] + held[b]) for a, b in pairs) / pair_mass
        two_largest = np.sort(held)[-2:].sum()
        rest = 1.0 - held.sum()
        third = lambda mass: 1.0 - rest / (1.0 - mass)  # noqa: E731  f(s)
        chord = third(0.0) - (third(0.0) - third(two_largest)) * mean / two_largest
        assert lower[0][size] >= pair_mass * chord - 1e-10
        assert lower[0][size] <= exact[size] + 1e-15


def test_pruned_scan_races_fewer_prefixes():
    """On model-shaped rows (V = 3,000, n = 3, 4, 6) the bounds leave the race a known share
    of the prefixes: a looser bound asks for more and fails here."""
    rng = np.random.default_rng(7)
    vocab, asked = 3000, []
    for num_drafts in (3, 4, 6):
        for _ in range(4):
            logits = 2.0 * rng.standard_normal(vocab)
            target, draft = (np.exp(logits + noise * rng.standard_normal(vocab)) for noise in (0.0, 0.5))
            rows = RowPairs.checked(target[None] / target.sum(), draft[None] / draft.sum())

            def race_counted(ordered, needed, num_drafts=num_drafts):
                asked.append(int(needed.sum()))
                return np.stack([race_all_in_mass(row, num_drafts, mask) for row, mask in zip(ordered, needed)])

            bounds = lambda ordered, inside, num_drafts=num_drafts: race_mass_bounds(  # noqa: E731
                ordered, num_drafts, WITHOUT.all_in_mass(ordered, 2), inside)
            pruned = prefix_scan_optimum(rows, race_counted, mass_bounds=bounds)
            full = prefix_scan_optimum(
                rows, lambda ordered, num_drafts=num_drafts: WITHOUT.all_in_mass(ordered, num_drafts))
            assert abs(pruned.acceptance[0] - full.acceptance[0]) <= 1e-13
    assert sum(asked) <= 400  # 317 here; 616 by the bounds of Q_2·f(m)·q(H)^{n−3} and Q_2·Π f(T_i)

# -- the head's arrival-count law through its moments ---------------------------------------
def _count_law_by_products(values, counts, times, n):
    """P(c of the head's tokens arrived by t), c < n, as the product of each token's
    Bernoulli(1 − e^{−tq}) truncated at z^n, token by token: the definition, slowly."""
    law = np.zeros((times.size, n))
    law[:, 0] = 1.0
    for value, count in zip(values, counts):
        stay = np.exp(-times * value)[:, None]
        for _ in range(count):
            law = law * stay + np.concatenate([np.zeros((times.size, 1)), law[:, :-1]], axis=1) * (1.0 - stay)
    return law


def _count_law_by_power_sums(values, counts, times, n):
    """The same law where every token has e^{tq} − 1 ≤ 1: exp(Σ_j (−1)^{j+1} P_j z^j / j) mod
    z^n with each power sum P_j = Σ m (e^{tq} − 1)^j summed token by token."""
    arrival = np.expm1(times[:, None] * values[None, :])
    assert arrival.max() <= 1.0
    logs = [-times * (values @ counts)] + [(-1) ** (j + 1) * (arrival**j @ counts) / j for j in range(1, n)]
    law = [np.exp(logs[0])]
    for c in range(1, n):
        law.append(sum(i * logs[i] * law[c - i] for i in range(1, c + 1)) / c)
    return np.stack(law, axis=1)


@pytest.mark.parametrize("num_drafts", [3, 4, 6])
def test_the_head_law_through_moments_equals_the_law_of_its_tokens(num_drafts):
    """A head of 4,000 distinct values spread over ten decades (a real row's tail): at each
    node most tokens have t·q ≤ RACE_TINY and enter through the moments and the series, the
    rest by their own power sums or as binomials; no NaN where t^k overflows (t up to 10^15).
    Where no token is large the law equals the
    one from power sums summed token by token to 1e-13 relative (a series cut at 1e-6 instead
    of 1e-17 fails here, as does the power-series check below at 1e-9); at every node, up
    to 10^15, it equals the token-by-token product of Bernoulli laws to that product's own
    rounding (1e-12)."""
    rng = np.random.default_rng(3)
    values = np.unique(10.0 ** rng.uniform(-12, -2, size=4000))
    counts = rng.integers(1, 3, size=values.size)
    times = 1e-3 * 2.0 ** (np.arange(180) / 3)  # up to 10^15, where t^k overflows at the series' k
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow there made NaN laws (inf · a zero moment)
        law = head_law(values, counts, times, num_drafts)
    assert np.all(np.isfinite(law))
    small = times * values.max() <= np.log(2.0)
    expected = _count_law_by_power_sums(values, counts, times[small], num_drafts)
    np.testing.assert_allclose(law[small], expected, rtol=1e-13, atol=1e-300)
    assert np.all(np.abs(law - _count_law_by_products(values, counts, times, num_drafts)) <= 1e-12)
    tiny = times[small, None] * values[None, :] <= race.RACE_TINY
    assert np.count_nonzero(tiny.any(axis=1) & ~tiny.all(axis=1)) >= 3  # nodes that took both paths


def head_law(values, counts, times, num_drafts):
    """The head's arrival-count law with every token added at once.  # -> [nodes, n]"""
    head = race._HeadLaw(np.asarray(times, dtype=np.float64), num_drafts)
    head.add(values, counts)
    return head.law(head.times.size)


def test_the_power_series_is_the_power_of_expm1_to_rounding():
    for num_drafts in (3, 6, 12):
        series = race._power_series(num_drafts)
        u = np.linspace(0.0, race.RACE_TINY, 101)
        for j in range(1, num_drafts):
            np.testing.assert_allclose(series[j] @ u[None, :] ** np.arange(series.shape[1])[:, None],
                                       np.expm1(u) ** j, rtol=4e-15, atol=0)  # the power's own rounding


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), num_drafts=st.sampled_from([3, 4, 6]), pieces=st.integers(1, 6),
       num_nodes=st.integers(1, 150))
def test_the_head_law_built_piece_by_piece_equals_the_law_from_scratch(seed, num_drafts, pieces, num_nodes):
    """A head added to ``_HeadLaw`` in pieces, as the windows add it (ties, repeated values,
    masses over twelve decades, some tiny at every node), has the law of the whole head added
    at once, and at every node the token-by-token product of Bernoulli laws to that product's
    rounding (1e-12)."""
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 400))
    values = 10.0 ** rng.uniform(-12, -0.5, size)
    values[rng.random(size) < 0.3] = values[0]  # ties
    counts = rng.integers(1, 4, size).astype(np.float64)
    times = race._race_times(num_drafts, num_nodes)
    whole = head_law(values, counts, times, num_drafts)
    head = race._HeadLaw(times, num_drafts)
    for piece in np.array_split(np.arange(size), np.sort(rng.integers(0, size, pieces - 1))):
        head.add(values[piece], counts[piece])
    np.testing.assert_allclose(head.law(num_nodes), whole, rtol=1e-13, atol=1e-15)
    unique, inverse = np.unique(values, return_inverse=True)
    per_value = np.bincount(inverse, weights=counts).astype(np.int64)
    assert np.all(np.abs(whole - _count_law_by_products(unique, per_value, times, num_drafts)) <= 1e-12)


@settings(max_examples=60, deadline=None)
@given(mass=st.floats(1e-12, 0.3), tokens=st.integers(1, 5000), num_drafts=st.sampled_from([3, 4, 6]))
def test_the_head_law_of_equal_masses_is_binomial(mass, tokens, num_drafts):
    """m tokens of one mass q: P(c arrived by t) = C(m, c)(1 − e^{−tq})^c e^{−(m−c)tq}, at nodes
    where the tokens are tiny, small and large (where n + 80 are large the law is 0 by design,
    and the binomial below 1e-18), to 1e-12 relative or the power series' rounding of a law
    that sums to 1."""
    times = race._race_times(num_drafts, 150)
    head = race._HeadLaw(times, num_drafts)
    head.add(np.full(tokens, mass))
    arrived, exponent = np.arange(num_drafts)[None, :], times[:, None] * mass
    choices = np.array([[float(comb(tokens, count)) for count in range(num_drafts)]])  # 0 beyond m
    expected = choices * (-np.expm1(-exponent)) ** arrived * np.exp(-np.maximum(tokens - arrived, 0) * exponent)
    np.testing.assert_allclose(head.law(times.size), expected, rtol=1e-12, atol=1e-15)  # the series' rounding


def test_a_window_has_the_nodes_of_its_head_horizon():
    """``_window_nodes``: the running selection (``_nth_largest_before``) gives each window the
    horizon of its head's n-th largest mass, as sorting the head does."""
    rng = np.random.default_rng(4)
    draft = np.sort(rng.dirichlet(np.full(5000, 0.1)))[::-1]  # r falls through several bands
    remaining = np.concatenate([np.cumsum(draft[::-1])[::-1], [0.0]])
    windows = race._windows(np.flatnonzero(remaining > 1e-9)[::7], remaining)
    assert len(windows) >= 3
    for num_drafts in (3, 6):
        nodes = race._window_nodes(draft, remaining, windows, num_drafts)
        start = race._race_times(num_drafts, 1)[0]
        for (first, last), num_nodes in zip(windows, nodes):
            head = np.sort(draft[:first])
            horizon = race._race_horizon(head[-num_drafts] if first >= num_drafts else 0.0, remaining[last], num_drafts)
            times = race._race_times(num_drafts, num_nodes)
            assert num_nodes % race.RACE_NODES_PER_OCTAVE == 0
            assert times[-1] >= horizon > times[-race.RACE_NODES_PER_OCTAVE - 1] if num_nodes > 3 else True


def test_a_subnormal_head_token_raises_no_warning():
    """A head token of subnormal mass (tiny at every node, large at none) enters the law
    without an overflow warning; Q is the same as with the token's mass at 0 to rounding."""
    draft = np.random.default_rng(0).dirichlet(np.ones(50))
    draft[10] = 1e-310
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mass = race_all_in_mass(draft, 3)
    draft[10] = 0.0
    np.testing.assert_allclose(mass[11:], race_all_in_mass(draft, 3)[11:], rtol=0, atol=1e-15)


def test_a_prefix_whose_mass_bounds_overflow_goes_to_the_race():
    """q = (1, 0, 1e-310 × 3): 1 − q(x) rounds to 0 for the first token, so the bounds' closed
    forms overflow. With n = 3 the drafts are token 0 and two of the three subnormal ones, so
    H = {0, 2, 3} has Q(H) = 1/3 and α* ≤ 1 + p(H) − Q(H) < 0.87: the prefix must not be pruned
    (an overflowed upper bound of 0 once pruned it and α* came out 1.0; a NaN lower bound made
    it ∞). The race then refuses the subnormal masses by name."""
    target = np.array([[0.19723982, 0.0, 0.0, 0.0, 0.80276018]])
    draft = np.array([[1.0, 0.0, 1e-310, 1e-310, 1e-310]])
    with pytest.raises(ValueError, match="subnormal"):
        get_verifier("rrs_without_replacement").optimum(target, draft, 3)
