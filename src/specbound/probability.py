"""Checked probability vectors and the few operations every verifier shares.

Convention (SPEC §0): the *target* distribution p comes from the large model, the
*draft* distribution q from the small one. Arrays are batched, batch first:
``[batch, vocab]``. A single vector ``[vocab]`` is accepted and promoted to a batch of 1.
"""

from __future__ import annotations

import numpy as np

SUM_TOLERANCE = 1e-6


class ZeroResidualError(ArithmeticError):
    """A residual distribution with no mass was about to be normalised.

    A correct lossless verifier never reaches this point: the residual is only sampled
    after a rejection, and a rejection implies positive residual mass. Seeing this error
    means the inputs broke a precondition or the algorithm has a bug.
    """


def as_distributions(name: str, probs, vocab_size: int | None = None) -> np.ndarray:
    """Return ``probs`` as float64 ``[batch, vocab]``, or raise ValueError naming ``name``.

    Rejects NaN/inf, negative entries, rows not summing to 1 within ``SUM_TOLERANCE``
    and, when ``vocab_size`` is given, a different vocabulary size.
    """
    array = np.asarray(probs, dtype=np.float64)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or array.shape[1] == 0:
        raise ValueError(f"{name}: expected shape [batch, vocab] or [vocab], got {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name}: contains NaN or infinite values")
    if np.any(array < 0):
        raise ValueError(f"{name}: contains negative probabilities (min {array.min():.3g})")
    sums = array.sum(axis=1)
    worst = np.max(np.abs(sums - 1.0))
    if worst > SUM_TOLERANCE:
        raise ValueError(
            f"{name}: rows must sum to 1 within {SUM_TOLERANCE:g}; worst row sums to "
            f"{sums[np.argmax(np.abs(sums - 1.0))]:.9g}"
        )
    if vocab_size is not None and array.shape[1] != vocab_size:
        raise ValueError(
            f"{name}: vocabulary size {array.shape[1]} differs from the target's {vocab_size}"
        )
    return array / sums[:, None]


def as_target_and_draft(target_probs, draft_probs) -> tuple[np.ndarray, np.ndarray]:
    """Check a (target, draft) pair: same vocabulary, same batch (a single row broadcasts)."""
    target = as_distributions("target_probs", target_probs)
    draft = as_distributions("draft_probs", draft_probs, vocab_size=target.shape[1])
    if target.shape[0] != draft.shape[0]:
        if target.shape[0] == 1:
            target = np.repeat(target, draft.shape[0], axis=0)
        elif draft.shape[0] == 1:
            draft = np.repeat(draft, target.shape[0], axis=0)
        else:
            raise ValueError(
                f"draft_probs: batch size {draft.shape[0]} differs from target_probs' "
                f"{target.shape[0]}"
            )
    return target, draft


def as_draft_tokens(draft_tokens, batch: int, vocab_size: int) -> np.ndarray:
    """Return ``draft_tokens`` as int64 ``[batch, num_drafts]`` inside the vocabulary."""
    tokens = np.asarray(draft_tokens)
    if tokens.ndim == 1:
        tokens = tokens[None, :] if batch == 1 else tokens[:, None]
    if tokens.ndim != 2 or tokens.shape[0] != batch or tokens.shape[1] == 0:
        raise ValueError(
            f"draft_tokens: expected shape [{batch}, num_drafts], got {np.shape(draft_tokens)}"
        )
    if not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"draft_tokens: expected integer token ids, got dtype {tokens.dtype}")
    if tokens.min() < 0 or tokens.max() >= vocab_size:
        raise ValueError(
            f"draft_tokens: token ids must lie in [0, {vocab_size}); got "
            f"[{tokens.min()}, {tokens.max()}]"
        )
    return tokens.astype(np.int64)


def support_size(probs: np.ndarray) -> np.ndarray:
    """Number of tokens with positive probability per row.  # [batch, vocab] -> [batch]"""
    return np.count_nonzero(probs > 0, axis=1)


def total_variation(target_probs: np.ndarray, draft_probs: np.ndarray) -> np.ndarray:
    """TV = Σ max(0, q − p) = ½ Σ |p − q| per row.  # [batch, vocab] x2 -> [batch]"""
    return 0.5 * np.abs(target_probs - draft_probs).sum(axis=-1)


def normalize_mass(mass: np.ndarray, what: str = "residual") -> np.ndarray:
    """Renormalise non-negative ``mass`` rows; raise ZeroResidualError on an empty row."""
    totals = mass.sum(axis=-1, keepdims=True)
    if np.any(totals <= 0):
        raise ZeroResidualError(
            f"{what} distribution has zero mass; a correct verifier never samples it"
        )
    return mass / totals


def residual(target_probs: np.ndarray, draft_probs: np.ndarray) -> np.ndarray:
    """norm((p − q)+), the law of the token emitted after a rejection (SPEC §1)."""
    return normalize_mass(np.maximum(target_probs - draft_probs, 0.0))


def sample_from(probs: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Inverse-CDF sample one token per row from (unnormalised) non-negative weights.

    ``uniforms`` in [0, 1) with one entry per row. Zero-weight tokens are never chosen.
    # probs [batch, vocab], uniforms [batch] -> [batch]
    """
    cumulative = np.cumsum(probs, axis=-1)
    totals = cumulative[:, -1]
    if np.any(totals <= 0):
        raise ZeroResidualError("cannot sample from a row with zero total mass")
    index = (cumulative <= (uniforms * totals)[:, None]).sum(axis=-1)
    last_positive = probs.shape[-1] - 1 - np.argmax(probs[:, ::-1] > 0, axis=-1)
    return np.minimum(index, last_positive)
