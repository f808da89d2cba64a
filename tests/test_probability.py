"""The shared probability helpers: one implementation for numpy and torch where they meet."""

import numpy as np
import torch

from specbound.probability import top_tokens


def test_top_tokens_equal_a_stable_sort_with_ties(rng):
    for _ in range(200):
        vocab, batch = int(rng.integers(2, 30)), int(rng.integers(1, 5))
        count = int(rng.integers(0, vocab + 1))
        draft = np.round(rng.random((batch, vocab)), 1)  # many ties
        expected = np.argsort(-draft, axis=-1, kind="stable")[:, :count]
        np.testing.assert_array_equal(top_tokens(draft, count), expected)
        np.testing.assert_array_equal(top_tokens(torch.tensor(draft), count).numpy(), expected)
