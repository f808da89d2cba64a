"""Exact-law helpers for the engine tests, over the tiny models of ``specbound.models.tiny``
(re-exported here: ``tiny_model``, ``noisy_copy``, ``tiny_config``, ``VOCAB``, ``EOS``).

Vocabulary of 6 tokens (token 0 is EOS), 2 layers, hidden size 16, fixed seeds. The
output head is scaled so that next-token laws are far from uniform, and the draft is a
noisy copy of the target so that acceptance is neither 0 nor 1 (about 0.7 per token on a
chain, 0.9 on a 2-draft tree): deep tree paths, residual tokens and bonus tokens all
occur often.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch
from scipy import stats as scipy_stats

from specbound.engine.backends import Entries
from specbound.models.tiny import EOS, VOCAB, noisy_copy, tiny_config, tiny_model

__all__ = ["EOS", "SIGNIFICANCE", "VOCAB", "chi_square_power", "chi_square_pvalue", "exact_sequence_law",
           "extend", "group_probs", "noisy_copy", "pooled_cells", "tiny_config", "tiny_model"]

SIGNIFICANCE = 0.001


def extend(lm, token_ids, last_only: bool = False) -> torch.Tensor:
    """Commit ``token_ids`` to row 0 of a single-row language model and return their
    next-token logits: the row's prefill when it is empty, else one scored chain committed
    whole.  # token_ids [n] -> logits [n, logits] ([1, logits] with last_only)"""
    if lm.lengths[0] == 0:
        return lm.prefill(0, token_ids, last_only=last_only)
    tokens = [int(token) for token in token_ids]
    scores = lm.score([Entries.chain(tokens)])
    lm.commit([list(range(len(tokens)))])
    return scores.logits(0, [len(tokens) - 1] if last_only else None)


def exact_sequence_law(model, prompt, processing, num_tokens, eos=EOS) -> dict[tuple, float]:
    """Law of the next ``num_tokens`` tokens under ``model`` with ``processing``, stopping
    at EOS, by enumeration with plain full forwards (no cache, no engine code)."""
    law = {(): 1.0}
    finished = {}
    for _ in range(num_tokens):
        prefixes = list(law)
        inputs = torch.tensor([list(prompt) + list(prefix) for prefix in prefixes])
        with torch.no_grad():
            logits = model(input_ids=inputs).logits[:, -1].float()
        probs = processing.probs(logits).double().numpy()
        probs /= probs.sum(axis=1, keepdims=True)
        grown = {}
        for prefix, row in zip(prefixes, probs):
            for token in np.flatnonzero(row > 0):
                sequence = prefix + (int(token),)
                mass = law[prefix] * row[token]
                (finished if token == eos else grown)[sequence] = mass
        law = grown
    return {**finished, **law}


def pooled_cells(law: dict, samples: int, min_expected: float = 5.0) -> list[list[tuple]]:
    """Group the law's cells so every group's expected count is >= ``min_expected``: all
    cells below it (and, if their pool is still too small, the next smallest) form one
    pooled group; every other cell is its own group."""
    cells = sorted(law, key=law.get)
    small = [cell for cell in cells if law[cell] * samples < min_expected]
    rest = cells[len(small) :]
    while small and rest and sum(law[cell] for cell in small) * samples < min_expected:
        small.append(rest.pop(0))
    return ([small] if small else []) + [[cell] for cell in rest]


def group_probs(law: dict, groups: list[list[tuple]]) -> np.ndarray:
    return np.array([sum(law.get(cell, 0.0) for cell in group) for group in groups])


def chi_square_pvalue(samples: list[tuple], law: dict) -> float:
    """Pooled χ² goodness of fit of sampled sequences to an exact law; a sample outside the
    law's support fails at once."""
    counts = Counter(samples)
    outside = set(counts) - set(law)
    assert not outside, f"sequences with zero probability were generated: {sorted(outside)[:5]}"
    groups = pooled_cells(law, len(samples))
    observed = np.array([sum(counts.get(cell, 0) for cell in group) for group in groups])
    expected = group_probs(law, groups)
    return float(scipy_stats.chisquare(observed, expected / expected.sum() * len(samples)).pvalue)


def chi_square_power(law: dict, alternative_law: dict, samples: int, level=SIGNIFICANCE) -> float:
    """Power of ``chi_square_pvalue`` at ``level`` with this many samples when they really
    come from ``alternative_law`` (noncentral χ² approximation)."""
    groups = pooled_cells(law, samples)
    null_probs = group_probs(law, groups)
    alternative_probs = group_probs(alternative_law, groups)
    degrees = len(groups) - 1
    noncentrality = samples * np.sum((alternative_probs - null_probs) ** 2 / null_probs)
    critical = scipy_stats.chi2.ppf(1 - level, degrees)
    return float(scipy_stats.ncx2.sf(critical, degrees, noncentrality))
