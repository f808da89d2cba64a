"""Properties of the optimal acceptance α* (SPEC.md §4.2): the LP, the brute-force subset
formula and the fast prefix scan agree with SPEC.md §4.4's fixtures and with each other, and
the exponential-race quadrature for Q(H) without replacement meets its stated accuracy."""

import json
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.instances import FIXTURE_A, FIXTURE_B, FIXTURE_OPTIMUM, random_pair, without_replacement_prefix_mass
from specbound.bounds import MAX_LP_VARIABLES, optimal_coupling, scan_order
from specbound.bounds.race import RACE_ACCURACY, _windows, race_all_in_mass
from specbound.bounds.subset import prefix_sums, restricted_order
from specbound.cli import main
from specbound.drafts import get_draft_scheme, optimal_acceptance, optimal_acceptance_bruteforce, optimal_acceptance_lp


def prefix_all_in_mass(draft_in_order, num_drafts, scheme):
    return get_draft_scheme(scheme).all_in_mass(draft_in_order, num_drafts)

FIXTURES = {"A": FIXTURE_A, "B": FIXTURE_B}


SCHEMES = ["with_replacement", "without_replacement", "greedy", "spechub"]


def instance(rng, vocab, num_drafts):
    """A random (target, draft) pair for exact comparisons: Dirichlet rows of varied
    concentration, exact zeros in target, in draft and in both, sometimes tied ratios
    (p = q or p = 2q on several tokens). Masses below 1e-6 are zeroed: the enumerated
    joint laws (drafts.py) renormalise by 1 − (used mass), which loses about
    eps / (smallest remaining mass). The draft keeps ≥ num_drafts tokens."""
    while True:
        concentration = rng.choice([0.2, 0.5, 1.0, 3.0])
        target = rng.dirichlet(np.full(vocab, concentration))
        draft = rng.dirichlet(np.full(vocab, concentration))
        style = rng.integers(4)
        if style == 1:  # zeros: in p only, in q only, in both
            target[rng.integers(vocab)] = 0.0
            draft[rng.integers(vocab)] = 0.0
            both = rng.integers(vocab)
            target[both] = draft[both] = 0.0
        elif style == 2:  # ties in p/q: equal on a block of tokens, double on another
            block = rng.permutation(vocab)[: vocab // 2]
            target[block] = draft[block] * rng.choice([1.0, 2.0])
        target[target < 1e-6] = 0.0
        draft[draft < 1e-6] = 0.0
        if target.sum() > 0 and np.count_nonzero(draft) >= num_drafts:
            return target / target.sum(), draft / draft.sum()


def all_in_mass_by_enumeration(draft, num_drafts, scheme, subsets):
    """Q(H) = P(all drafts ∈ H) for each boolean row of ``subsets``, from the joint law."""
    tuples, tuple_probs = get_draft_scheme(scheme).joint_law(draft, num_drafts)
    return np.array([tuple_probs[np.all(subset[tuples], axis=1)].sum() for subset in subsets])


@pytest.mark.parametrize(("fixture", "scheme", "num_drafts"), sorted(FIXTURE_OPTIMUM))
def test_lp_bruteforce_and_prefix_scan_match_spec_fixtures(fixture, scheme, num_drafts):
    target, draft = FIXTURES[fixture]
    expected = FIXTURE_OPTIMUM[fixture, scheme, num_drafts]
    lp = optimal_acceptance_lp(target, draft, num_drafts, scheme)
    brute = optimal_acceptance_bruteforce(target, draft, num_drafts, scheme)
    fast = optimal_acceptance(target, draft, num_drafts, scheme)
    assert lp[0] == pytest.approx(expected, abs=1e-6)
    assert brute.acceptance[0] == pytest.approx(expected, abs=1e-6)
    assert fast.acceptance[0] == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_prefix_scan_equals_lp_and_bruteforce_on_random_instances(scheme):
    """≥ 200 instances per scheme, V ≤ 8, n ≤ 3: fast α* = LP = brute force, and the
    returned H* attains the minimum: 1 + p(H*) − Q(H*) = α*."""
    rng = np.random.default_rng(["with", "without", "greedy", "spechub"].index(scheme.split("_")[0]))
    for trial in range(200):
        vocab = int(rng.integers(2, 9))
        num_drafts = 2 if scheme == "spechub" else int(rng.integers(1, min(3, vocab) + 1))
        target, draft = instance(rng, vocab, num_drafts)
        fast = optimal_acceptance(target, draft, num_drafts, scheme)
        brute = optimal_acceptance_bruteforce(target, draft, num_drafts, scheme)
        lp = optimal_acceptance_lp(target, draft, num_drafts, scheme)
        context = (trial, num_drafts, target.tolist(), draft.tolist())
        assert fast.acceptance[0] == pytest.approx(brute.acceptance[0], abs=1e-9), context
        assert fast.acceptance[0] == pytest.approx(lp[0], abs=1e-8), context
        subset = fast.optimal_subset[0]
        certified = 1 + target[subset].sum() - all_in_mass_by_enumeration(
            draft, num_drafts, scheme, [subset]
        )[0]
        assert certified == pytest.approx(fast.acceptance[0], abs=1e-9), context


@pytest.mark.parametrize("scheme", ["with_replacement", "without_replacement"])
def test_prefix_scan_uses_ascending_not_reverse_order(scheme):
    """On instances where scanning prefixes of p/q *descending* misses the optimum, the
    fast path still equals brute force (SPEC.md §4.2: the reverse order is wrong)."""
    rng = np.random.default_rng(7)
    reverse_misses = 0
    for _ in range(150):
        vocab = int(rng.integers(3, 8))
        num_drafts = int(rng.integers(2, 4))
        target, draft = instance(rng, vocab, num_drafts)
        order = scan_order(target[None], draft[None])[:, ::-1]
        mass = prefix_all_in_mass(np.take_along_axis(draft[None], order, axis=1), num_drafts, scheme)
        reverse = 1 + np.min(np.cumsum(np.concatenate([[0.0], target[order[0]]])) - mass[0])
        brute = optimal_acceptance_bruteforce(target, draft, num_drafts, scheme).acceptance[0]
        if reverse - brute > 1e-6:
            reverse_misses += 1
            fast = optimal_acceptance(target, draft, num_drafts, scheme).acceptance[0]
            assert fast == pytest.approx(brute, abs=1e-9)
    assert reverse_misses >= 30


def test_scan_order_is_the_exact_ratio_order():
    """scan_order = stable argsort of p/q, with p/0 = ∞ and then 0/0 last, also for
    ratios that agree in all but their last bits (the fast path's fix-up) and −0.0."""
    rng = np.random.default_rng(13)
    target, draft = instance(rng, 4000, 1)
    target[:50] = draft[:50] * (1 + np.arange(50)[::-1] * 2.0**-50)  # ratios an ulp apart
    target[60:70], draft[60:70] = 0.0, 0.0  # 0/0
    target[70], draft[71] = -0.0, 0.0
    targets, drafts = np.stack([target, target[::-1]]), np.stack([draft, draft[::-1]])
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = np.argsort(targets / drafts, axis=1, kind="stable")  # NaN sorts last
    np.testing.assert_array_equal(scan_order(targets, drafts), expected)


def test_scan_order_takes_a_guess_only_where_it_is_the_scan_order():
    """A guess is taken where (ratio bits, id) rise strictly along it and sorted away
    elsewhere, row by row: the right order, tied tokens (0/0, equal ratios) out of id order,
    ratios an ulp apart swapped, a permutation at random, ids out of range, a wrong shape."""
    rng = np.random.default_rng(13)
    target, draft = instance(rng, 4000, 1)
    target[:50] = draft[:50] * (1 + np.arange(50)[::-1] * 2.0**-50)  # ratios an ulp apart
    target[60:70], draft[60:70] = 0.0, 0.0  # 0/0
    target[80:90], draft[80:90] = 0.25 * draft[80], draft[80]  # one ratio, ten tokens
    targets, drafts = np.stack([target, target[::-1]]), np.stack([draft, draft[::-1]])
    expected = scan_order(targets, drafts)
    np.testing.assert_array_equal(scan_order(targets, drafts, expected), expected)
    for row in range(2):
        for first, second in ((60, 61), (80, 81), (0, 1)):
            wrong = expected.copy()
            place = [np.flatnonzero(wrong[row] == token)[0] for token in (first, second)]
            wrong[row, place] = wrong[row, place[::-1]]
            np.testing.assert_array_equal(scan_order(targets, drafts, wrong), expected)
    shuffled = np.stack([expected[0], rng.permutation(4000)])
    np.testing.assert_array_equal(scan_order(targets, drafts, shuffled), expected)
    outside = expected.copy()
    outside[1, -1] = 4000
    for guess in (outside, expected[:1], expected[:, :-1], expected.astype(float)):
        np.testing.assert_array_equal(scan_order(targets, drafts, guess), expected)


@settings(max_examples=60, deadline=None)
@given(vocab=st.integers(2, 60), seed=st.integers(0, 2**32 - 1), values=st.integers(1, 5))
def test_restricted_order_is_the_scan_order_of_the_kept_tokens(vocab, seed, values):
    """The scan order restricted to a subset of the tokens and renumbered is the subset's
    own scan order, ties (few distinct values: many equal ratios, 0/0, p/0) in id order."""
    rng = np.random.default_rng(seed)
    levels = np.array([0.0, 1.0, 2.0, 3.0, 0.5, 6.0])[: values + 1]
    target, draft = rng.choice(levels, vocab), rng.choice(levels, vocab)
    kept = rng.random(vocab) < rng.uniform(0.2, 1.0)
    kept[0] = True
    order = restricted_order(scan_order(target[None], draft[None])[0], kept)
    np.testing.assert_array_equal(order, scan_order(target[None, kept], draft[None, kept])[0])


def test_prefix_scan_is_batched_row_by_row():
    rng = np.random.default_rng(3)
    pairs = [instance(rng, 6, 3) for _ in range(8)]
    targets, drafts = np.array([p for p, _ in pairs]), np.array([q for _, q in pairs])
    for scheme in ["with_replacement", "without_replacement", "greedy"]:
        batched = optimal_acceptance(targets, drafts, 3, scheme)
        for row, (target, draft) in enumerate(pairs):
            single = optimal_acceptance(target, draft, 3, scheme)
            assert batched.acceptance[row] == single.acceptance[0]
            np.testing.assert_array_equal(batched.optimal_subset[row], single.optimal_subset[0])


def test_race_quadrature_meets_its_accuracy_against_enumeration():
    """Q(H_k) from the exponential-race integral vs exact enumeration of ordered draws,
    every prefix, n = 3..5, including near-degenerate drafts (a dominant token, masses
    down to 1e-9, ties): max error ≤ RACE_ACCURACY."""
    rng = np.random.default_rng(11)
    worst = 0.0
    for trial in range(300):
        vocab = int(rng.integers(3, 9))
        num_drafts = int(rng.integers(3, min(5, vocab) + 1))
        draft = rng.dirichlet(np.full(vocab, [0.05, 0.3, 1.0, 5.0][trial % 4]))
        if trial % 5 == 0:  # one dominant token, the rest tiny
            draft = np.concatenate([[1.0], 10.0 ** rng.uniform(-9, -2, vocab - 1)])
        draft[draft < 1e-9] = 0.0
        if np.count_nonzero(draft) < num_drafts:
            continue
        draft = rng.permutation(draft / draft.sum())
        error = np.abs(race_all_in_mass(draft, num_drafts) - without_replacement_prefix_mass(draft, num_drafts))
        worst = max(worst, error.max())
    assert worst <= RACE_ACCURACY


def test_race_quadrature_matches_the_pair_formula_at_large_vocabulary():
    """n = 2 has the closed form; the race integral must agree at V = 3000 on peaked rows,
    including rows whose prefixes span several windows (r over more than one RACE_SPAN band)."""
    rng = np.random.default_rng(5)
    vocab = 3000
    windowed_rows = 0
    for scale in [1.0, 3.0, 10.0, 12.0]:  # flat to a 0.999 top token
        logits = scale * rng.standard_normal(vocab)
        draft = np.exp(logits - logits.max())
        draft = rng.permutation(draft / draft.sum())
        remaining = np.concatenate([np.cumsum(draft[::-1])[::-1], [0.0]])
        windowed_rows += len(_windows(np.flatnonzero(remaining > 0), remaining)) > 2
        pairs = prefix_all_in_mass(draft[None], 2, "without_replacement")[0]
        assert np.abs(race_all_in_mass(draft, 2) - pairs).max() <= RACE_ACCURACY
    assert windowed_rows >= 2


def test_without_replacement_mass_is_exact_next_to_a_dominant_token():
    """q = (1 − 5.7e-7, tiny masses): 1 − q(x) must not be formed by cancellation. Both the
    n = 2 closed form and the race integral are checked against rational arithmetic."""
    rng = np.random.default_rng(17)
    tiny = 10.0 ** rng.uniform(-10, -7.5, 24)
    draft = rng.permutation(np.concatenate([[1.0 - tiny.sum()], tiny]))
    exact_draft = [Fraction(x) for x in draft]
    total = sum(exact_draft)
    for k in [2, 5, 12, 24]:
        inside = exact_draft[:k]
        exact = sum(q / total * (sum(inside) - q) / (total - q) for q in inside)
        closed_form = prefix_all_in_mass(draft[None], 2, "without_replacement")[0, k]
        assert abs(closed_form - float(exact)) <= 1e-14
        assert abs(race_all_in_mass(draft, 2)[k] - float(exact)) <= RACE_ACCURACY


def test_race_quadrature_matches_the_triple_sum_at_moderate_vocabulary():
    """n = 3: Q(H) = Σ_{x≠y∈H} q_x q_y (q(H) − q_x − q_y) / ((1 − q_x)(1 − q_x − q_y)),
    checked on prefixes of a peaked V = 300 row."""
    rng = np.random.default_rng(9)
    logits = 6.0 * rng.standard_normal(300)
    draft = np.exp(logits - logits.max())
    draft /= draft.sum()
    race = race_all_in_mass(draft, 3)
    for k in [3, 50, 150, 299, 300]:
        inside = draft[:k]
        first, second = np.meshgrid(inside, inside, indexing="ij")
        third = np.clip(inside.sum() - first - second, 0.0, None)
        terms = first * second * third / ((1 - first) * (1 - first - second))
        np.fill_diagonal(terms, 0.0)
        assert race[k] == pytest.approx(terms.sum(), abs=RACE_ACCURACY)


@pytest.mark.parametrize("scheme", ["with_replacement", "without_replacement", "greedy"])
def test_optimal_coupling_has_the_right_marginals_and_value(rng, scheme):
    for _ in range(5):
        target, draft = random_pair(rng, 6)
        tuples, tuple_probs = get_draft_scheme(scheme).joint_law(draft, 3)
        coupling, acceptance = optimal_coupling(target, tuples, tuple_probs)
        assert np.all(coupling >= 0)
        np.testing.assert_allclose(coupling.sum(axis=1), tuple_probs, atol=1e-9)
        np.testing.assert_allclose(coupling.sum(axis=0), target, atol=1e-9)
        hits = np.zeros_like(coupling)
        np.put_along_axis(hits, tuples, 1.0, axis=1)
        assert (coupling * hits).sum() == pytest.approx(acceptance, abs=1e-9)


def test_bruteforce_certificate_attains_the_minimum(rng):
    target, draft = random_pair(rng, 5)
    result = optimal_acceptance_bruteforce(target, draft, 2, "with_replacement")
    subset = result.optimal_subset[0]
    assert result.acceptance[0] == pytest.approx(
        1 + target[subset].sum() - draft[subset].sum() ** 2, abs=1e-12
    )


def test_optimal_coupling_refuses_a_too_large_lp():
    vocab = 200
    tuples = np.array([[x, y] for x in range(vocab) for y in range(vocab)])
    assert len(tuples) * vocab > MAX_LP_VARIABLES
    with pytest.raises(ValueError, match="variables"):
        optimal_coupling(np.full(vocab, 1 / vocab), tuples, np.full(len(tuples), 1 / len(tuples)))


def test_bruteforce_refuses_a_large_vocabulary():
    with pytest.raises(ValueError, match="2\\^V"):
        optimal_acceptance_bruteforce(np.full(20, 0.05), np.full(20, 0.05), 2, "with_replacement")


@pytest.mark.parametrize(
    ("target", "draft", "num_drafts", "scheme", "message"),
    [
        ([0.5, 0.6], [0.5, 0.5], 2, "with_replacement", "target_probs: rows must sum"),
        ([0.5, 0.5], [0.2, 0.3, 0.5], 2, "with_replacement", "vocabulary size"),
        ([0.5, 0.5], [0.5, 0.5], 0, "with_replacement", "num_drafts"),
        ([0.5, 0.5], [0.5, 0.5], 3, "without_replacement", "num_drafts"),
        ([0.5, 0.5], [0.5, 0.5], 3, "spechub", "num_drafts"),
        ([0.5, 0.5], [0.5, 0.5], 2, "no_such_scheme", "scheme"),
    ],
)
def test_solvers_reject_bad_input(target, draft, num_drafts, scheme, message):
    for solver in (optimal_acceptance_lp, optimal_acceptance_bruteforce, optimal_acceptance):
        with pytest.raises(ValueError, match=message):
            solver(target, draft, num_drafts, scheme)


def test_bounds_optimum_command_prints_alpha_and_a_valid_certificate(capsys):
    assert main(["bounds", "optimum", "-n", "2", "--json"]) == 0
    records = {r["scheme"]: r for r in json.loads(capsys.readouterr().out)["schemes"]}
    target, draft = FIXTURE_A
    for scheme in ["with_replacement", "without_replacement", "greedy", "spechub"]:
        assert records[scheme]["acceptance"] == pytest.approx(FIXTURE_OPTIMUM["A", scheme, 2], abs=1e-6)
        subset = np.zeros(4, dtype=bool)
        subset[records[scheme]["subset"]] = True
        mass = all_in_mass_by_enumeration(draft, 2, scheme, [subset])[0]
        assert 1 + target[subset].sum() - mass == pytest.approx(records[scheme]["acceptance"], abs=1e-12)


def test_bounds_plot_command_saves_png_and_numbers_with_verifiers_below_the_optimum(tmp_path, capsys):
    """Every lossless verifier's exact acceptance ≤ α* of its draft scheme at every n, and
    the fixture's α* rows are reproduced."""
    assert main(["bounds", "plot", "--max-drafts", "3", "--out", str(tmp_path), "--json"]) == 0
    numbers = json.loads(capsys.readouterr().out)
    assert (tmp_path / "acceptance_vs_drafts.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "acceptance_vs_drafts.json").read_text()) == numbers
    for scheme, values in numbers["optimum"].items():
        for num_drafts, value in zip(numbers["num_drafts"], values):
            if ("A", scheme, num_drafts) in FIXTURE_OPTIMUM:
                assert value == pytest.approx(FIXTURE_OPTIMUM["A", scheme, num_drafts], abs=1e-6)
    for name, verifier in numbers["verifiers"].items():
        for value, optimum in zip(verifier["acceptance"], numbers["optimum"][verifier["scheme"]]):
            if value is not None:
                assert value <= optimum + 1e-9, name


def test_bounds_commands_reject_bad_input(capsys):
    assert main(["bounds", "plot", "--max-drafts", "0"]) == 2
    assert "max_drafts" in capsys.readouterr().err
    assert main(["bounds", "optimum", "--target", "0.5,0.6", "--draft", "0.5,0.5"]) == 2
    assert "target_probs" in capsys.readouterr().err


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(1, 300), st.integers(0, 2**31 - 1), st.sampled_from([np.float64, np.float32]))
def test_prefix_sums_are_numpy_running_sums_bit_for_bit(rows, vocab, seed, dtype):
    """prefix_sums' compiled loop adds in np.cumsum's order: its values are numpy's, bit for
    bit, on rows spanning many magnitudes (float32 rows summed in float64, as numpy does)."""
    rng = np.random.default_rng(seed)
    values = (rng.random((rows, vocab)) * 10.0 ** rng.uniform(-30, 0, (rows, vocab))).astype(dtype)
    expected = np.zeros((rows, vocab + 1))
    np.cumsum(values, axis=1, out=expected[:, 1:])
    assert np.array_equal(prefix_sums(values), expected)
