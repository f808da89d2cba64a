"""The shared probability helpers: one implementation for numpy and torch where they meet."""

import numpy as np
import torch

from specbound.probability import (
    LAST_KEY_BITS,
    ascending_order,
    pairwise_sum,
    sample_from,
    sample_from_torch,
    top_tokens,
)


def test_top_tokens_equal_a_stable_sort_with_ties(rng):
    for _ in range(200):
        vocab, batch = int(rng.integers(2, 30)), int(rng.integers(1, 5))
        count = int(rng.integers(0, vocab + 1))
        draft = np.round(rng.random((batch, vocab)), 1)  # many ties
        expected = np.argsort(-draft, axis=-1, kind="stable")[:, :count]
        np.testing.assert_array_equal(top_tokens(draft, count), expected)
        np.testing.assert_array_equal(top_tokens(torch.tensor(draft), count).numpy(), expected)


def test_ascending_order_is_the_stable_order_of_the_values(rng):
    """The radix sort on the floats' bits equals a stable sort: ties keep index order, and
    values that agree in the bits above the packed index (within 2^-21 of each other) are
    put in exact order, with 0, subnormals and ∞ among them; the NaN of ``LAST_KEY_BITS``
    goes after ∞, its copies in index order."""
    base = rng.random(500)
    last = np.array([LAST_KEY_BITS], dtype=np.uint64).view(np.float64)[0]
    cases = [
        rng.random(1000),
        np.round(rng.random(1000), 2),  # ties
        np.concatenate([base, base * (1 + 1e-9 * rng.random(500)), [0.0, 5e-324, 1e-310, np.inf, np.inf]]),
        np.concatenate([base * (1 + 1e-9 * rng.random(500)), base, base]),  # short runs out of order, with equal keys
        rng.permutation(np.repeat(rng.random(3), 200) * (1 + 1e-12 * rng.random(600))),  # long runs out of order
        rng.permutation(np.concatenate([rng.random(300), [np.inf] * 5, [0.0] * 5])),
        rng.random(151_936) ** 8,  # a vocabulary's worth, over many octaves
        np.array([]), np.array([0.5]), np.array([np.inf, 0.0]),
    ]
    for keys in cases:
        order = ascending_order(keys)
        np.testing.assert_array_equal(order, np.argsort(keys, kind="stable"))
        with_last = keys.copy()
        chosen = rng.random(keys.size) < 0.1
        with_last[chosen] = last
        others = np.flatnonzero(~chosen)
        expected = np.concatenate([others[np.argsort(keys[others], kind="stable")], np.flatnonzero(chosen)])
        np.testing.assert_array_equal(ascending_order(with_last), expected)


def test_pairwise_sum_is_numpys_sum_bit_for_bit(rng):
    """The compiled loops' sum is ``ndarray.sum``'s, to the last bit: every length up to a few
    blocks (each split and leftover case), long rows, runs inside a row, a row of a batch."""
    lengths = [*range(300), 1024, 1031, 4097, 65_536, 151_936, *rng.integers(300, 200_000, 8)]
    for length in lengths:
        values = rng.random(length) ** 12  # magnitudes over tens of orders: rounding at every addition
        assert pairwise_sum(values, 0, length) == values.sum()
        start, stop = sorted(rng.integers(0, length + 1, 2))
        assert pairwise_sum(values, start, stop) == values[start:stop].sum()
    rows = rng.random((3, 5000))
    assert [pairwise_sum(row, 0, row.size) for row in rows] == rows.sum(axis=1).tolist()


def test_the_torch_sampler_draws_what_its_numpy_twin_draws(rng):
    """Inverse CDF from the same uniforms: the same token, never one of weight 0 — also at
    the extreme uniforms and on rows of mostly zeros (where the last positive token matters)."""
    for _ in range(300):
        vocab, batch = int(rng.integers(1, 40)), int(rng.integers(1, 6))
        weights = rng.random((batch, vocab)) * (rng.random((batch, vocab)) < 0.3)
        weights[np.arange(batch), rng.integers(0, vocab, batch)] += rng.random(batch) + 1e-300
        uniforms = rng.random(batch)
        uniforms[rng.random(batch) < 0.3] = np.nextafter(1.0, 0.0)
        uniforms[rng.random(batch) < 0.2] = 0.0
        drawn = sample_from_torch(torch.tensor(weights), torch.tensor(uniforms)).numpy()
        np.testing.assert_array_equal(drawn, sample_from(weights, uniforms))
        assert np.all(weights[np.arange(batch), drawn] > 0)
