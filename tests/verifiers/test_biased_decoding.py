"""Bias vs rejection [YIN Thm 4, Thm 5]: Loss*(b) is the least bias over every resampling
law (checked by LP), P(reject) + Loss* = TV on the front to 1e-12, and nothing lies below."""

import numpy as np
import pytest
from scipy.optimize import linprog

from specbound.verifiers.biased import (
    bias,
    epsilon_sweep,
    front_acceptance,
    loss_star,
    optimal_resampling_law,
    optimal_resampling_set,
    rejection_probability,
)
from specbound.probability import total_variation

FIXTURE_A = (np.array([0.4, 0.3, 0.2, 0.1]), np.array([0.1, 0.2, 0.3, 0.4]))  # SPEC §4.4
EPSILONS = np.r_[0.0, np.geomspace(1e-4, 2.0, 40)]


def random_pair(rng, vocab):
    """(target, draft) from Dirichlet(0.7) with one exact zero in each (vocab > 3)."""
    target, draft = rng.dirichlet(np.full(vocab, 0.7), size=2)
    if vocab > 3:
        target[rng.integers(vocab)] = 0.0
        draft[rng.integers(vocab)] = 0.0
    return target / target.sum(), draft / draft.sum()


def least_bias_by_lp(target, draft, acceptance):
    """min over resampling laws R of TV(b·q + R·z, p), z = Σ(1 − b)q, as an LP in (R, s)."""
    vocab = target.size
    accepted, rejected = acceptance * draft, ((1 - acceptance) * draft).sum()
    # s ≥ ±(accepted + z R − p); minimise ½ Σ s
    identity = np.eye(vocab)
    upper = np.block([[rejected * identity, -identity], [-rejected * identity, -identity]])
    bound = np.r_[target - accepted, accepted - target]
    equality = np.r_[np.ones(vocab), np.zeros(vocab)][None, :]
    result = linprog(
        np.r_[np.zeros(vocab), 0.5 * np.ones(vocab)], A_ub=upper, b_ub=bound,
        A_eq=equality, b_eq=[1.0], bounds=[(0, None)] * (2 * vocab), method="highs",
    )
    assert result.status == 0
    return result.fun


def test_loss_star_is_the_least_bias_over_all_resampling_laws():
    rng = np.random.default_rng(1)
    for _ in range(60):
        vocab = int(rng.integers(2, 7))
        target, draft = random_pair(rng, vocab)
        acceptance = rng.random(vocab) * (rng.random(vocab) < 0.8)
        least = loss_star(target, draft, acceptance)[0]
        assert least == pytest.approx(least_bias_by_lp(target, draft, acceptance), abs=1e-9)
        assert least == pytest.approx(np.maximum(acceptance * draft - target, 0).sum(), abs=1e-12)
        best = optimal_resampling_law(target, draft, acceptance)
        assert bias(target, draft, acceptance, best)[0] == pytest.approx(least, abs=1e-12)
        allowed = optimal_resampling_set(target, draft, acceptance)[0]
        assert np.all(best[0][~allowed] == 0)
        for resampling in rng.dirichlet(np.ones(vocab), size=20):
            assert bias(target, draft, acceptance, resampling)[0] >= least - 1e-12


def test_resampling_outside_the_optimal_set_adds_bias():
    target, draft = FIXTURE_A
    acceptance = np.array([1.0, 1.0, 0.9, 0.5])  # rejections happen; p < b·q on tokens 2, 3
    allowed = optimal_resampling_set(target, draft, acceptance)[0]
    assert allowed.tolist() == [True, True, False, False]
    least = loss_star(target, draft, acceptance)[0]
    for token in np.flatnonzero(~allowed):
        assert bias(target, draft, acceptance, np.eye(4)[token])[0] > least + 1e-3


@pytest.mark.parametrize("seed", range(5))
def test_decoding_opt_sweep_is_on_the_front_to_1e_12(seed):
    # Thm 5: P(reject) + Loss*(b) = TV for b = min(1, (p + ε)/q), and OPT's bias is Loss*.
    target, draft = random_pair(np.random.default_rng(seed), 8)
    tv = total_variation(target, draft)
    for point in epsilon_sweep(target, draft, EPSILONS, "decoding_opt"):
        assert point.rejection + point.least_bias == pytest.approx(tv, abs=1e-12)
        assert point.bias == pytest.approx(point.least_bias, abs=1e-12)


@pytest.mark.parametrize("method", ["decoding_uno", "decoding_uno_draft"])
def test_decoding_uno_lies_on_or_above_the_front(method):
    target, draft = FIXTURE_A
    tv = total_variation(target, draft)
    points = epsilon_sweep(target, draft, EPSILONS, method)
    for point in points:
        assert point.bias >= point.least_bias - 1e-12
        assert point.rejection + point.bias >= tv - 1e-12
    assert max(point.bias - point.least_bias for point in points) > 0.01  # strictly worse


def test_zero_epsilon_opt_is_speculative_sampling_and_uno_is_not_lossless():
    target, draft = FIXTURE_A
    tv = float(total_variation(target, draft))
    (opt,) = epsilon_sweep(target, draft, [0.0], "decoding_opt")
    assert (opt.rejection, opt.bias) == (pytest.approx(tv, abs=1e-12), pytest.approx(0, abs=1e-12))
    # UNO keeps b = min(1, p/q) but resamples from p, so O = min(p, q) + TV·p ≠ p.
    (uno,) = epsilon_sweep(target, draft, [0.0], "decoding_uno")
    expected = float(total_variation(np.minimum(target, draft) + tv * target, target))
    assert uno.bias == pytest.approx(expected, abs=1e-12) and uno.bias > 0.1


def test_front_acceptance_walks_the_front_from_lossless_to_always_accept():
    rng = np.random.default_rng(3)
    for _ in range(20):
        target, draft = random_pair(rng, 6)
        tv = total_variation(target, draft)
        for fraction in np.linspace(0, 1, 11):
            acceptance = front_acceptance(target, draft, fraction)
            rejection = rejection_probability(target, draft, acceptance)
            assert rejection + loss_star(target, draft, acceptance) == pytest.approx(tv, abs=1e-12)
            assert rejection == pytest.approx((1 - fraction) * tv, abs=1e-12)


def test_no_acceptance_vector_beats_the_front():
    rng = np.random.default_rng(4)
    for _ in range(200):
        target, draft = random_pair(rng, 6)
        acceptance = rng.random(6)
        total = rejection_probability(target, draft, acceptance) + loss_star(target, draft, acceptance)
        assert total == pytest.approx(1 - np.minimum(acceptance * draft, target).sum(), abs=1e-12)
        assert total >= total_variation(target, draft) - 1e-12


def test_scaled_lossless_acceptance_stays_unbiased_but_rejects_more():
    # SPEC §1 [YIN Thm 2]: b = λ·min(1, p/q), λ < 1, has Loss* = 0 and rejection 1 − λ(1 − TV).
    target, draft = FIXTURE_A
    tv = float(total_variation(target, draft))
    for scale in (0.2, 0.5, 0.9):
        acceptance = scale * front_acceptance(target, draft, 0.0)
        assert loss_star(target, draft, acceptance)[0] == pytest.approx(0.0, abs=1e-15)
        rejection = rejection_probability(target, draft, acceptance)[0]
        assert rejection == pytest.approx(1 - scale * (1 - tv), abs=1e-12)
        assert rejection > tv


def test_bad_inputs_are_refused():
    target, draft = FIXTURE_A
    with pytest.raises(ValueError, match="acceptance.*\\[0, 1\\]"):
        loss_star(target, draft, np.array([0.5, 1.2, 0.3, 0.1]))
    with pytest.raises(ValueError, match="acceptance: shape"):
        loss_star(target, draft, np.ones(3))
    with pytest.raises(ValueError, match="target_probs.*sum to 1"):
        loss_star(target * 2, draft, np.ones(4))
    with pytest.raises(ValueError, match="draft_probs: vocabulary size"):
        loss_star(target, draft[:3] / draft[:3].sum(), np.ones(4))
    with pytest.raises(ValueError, match="method"):
        epsilon_sweep(target, draft, [0.1], "decoding_best")
    with pytest.raises(ValueError, match="epsilon"):
        epsilon_sweep(target, draft, [-0.1])
    with pytest.raises(ValueError, match="one row"):
        epsilon_sweep(np.stack([target, target]), np.stack([draft, draft]), [0.1])
    with pytest.raises(ValueError, match="fraction"):
        front_acceptance(target, draft, 1.5)
