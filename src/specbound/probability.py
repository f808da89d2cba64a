"""Checked probability vectors and the few operations every layer shares, numpy and torch.

Convention (SPEC.md §0): the *target* distribution p comes from the large model, the
*draft* distribution q from the small one. Arrays are batched, batch first:
``[batch, vocab]``. A single vector ``[vocab]`` is accepted and promoted to a batch of 1.

Numerics kept in one place:
- a complement 1 − q(x) next to a dominant token is summed from the other tokens
  (``mass_of_the_others``): a peaked row can store q(top) = 1.0 beside tokens of 1e-17,
  where 1.0 − q(top) would be 0;
- a residual with no mass is never divided by (``ZeroResidualError``);
- samplers draw by inverse CDF from one uniform per row, the numpy and the torch version
  alike, so the two can be compared draw for draw;
- a compiled loop (numba) that sums a row sums it in numpy's own order (``pairwise_sum``),
  so it gives what the numpy expression it replaces gave, bit for bit.
- float keys (ratios p/q, masses) are put in order by one stable radix sort on their bits
  (``ascending_order``), wherever an exact computation sorts them.

The math layers import torch only inside their torch paths, so that the exact computations
(``specbound accept``, ``bounds``, ``theory``) run without it: a tensor exists only once
torch is imported, which is what ``is_tensor`` asks before looking at one.
"""

from __future__ import annotations

import sys

import numpy as np

from specbound.compiled import compiled

SUM_TOLERANCE = 1e-6
PAIRWISE_BLOCK = 128  # numpy's pairwise summation sums blocks of up to this many values directly
INDEX_BITS = 31  # ascending_order packs an index below a key's bits: at most 2^31 keys
RADIX_BITS = 11  # bits of a key sorted per radix pass of ascending_order: three passes
INSERTION_RUN = 32  # ascending_order's runs of keys tied above the index bits up to this long go by insertion
LAST_KEY_BITS = 0x7FF8000000000000  # a quiet NaN, above ∞ as an unsigned integer: ascending_order's last key


class ZeroResidualError(ArithmeticError):
    """A residual distribution with no mass was about to be normalised.

    A correct lossless verifier never reaches this point: the residual is only sampled
    after a rejection, and a rejection implies positive residual mass. Seeing this error
    means the inputs broke a precondition or the algorithm has a bug.
    """


def is_tensor(value) -> bool:
    """Whether ``value`` is a torch tensor, without importing torch (no tensor exists before it is)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def array_module(value):
    """The module whose functions take ``value``: torch for a torch tensor, else numpy."""
    return sys.modules["torch"] if is_tensor(value) else np


# -- checked inputs ----------------------------------------------------------------------
def as_distributions(name: str, probs, vocab_size: int | None = None) -> np.ndarray:
    """Return ``probs`` as float64 ``[batch, vocab]``, or raise ValueError naming ``name``.

    Rejects NaN/inf, negative entries, rows not summing to 1 within ``SUM_TOLERANCE``
    and, when ``vocab_size`` is given, a different vocabulary size.
    """
    try:
        array = np.asarray(probs, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected numbers of shape [batch, vocab] or [vocab]") from None
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or array.shape[1] == 0 or array.shape[0] == 0:
        raise ValueError(f"{name}: expected shape [batch, vocab] or [vocab], got {array.shape}")
    problem = entries_problem(np.ascontiguousarray(array))
    if problem == NOT_FINITE:
        raise ValueError(f"{name}: contains NaN or infinite values")
    if problem == NEGATIVE:
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


NOT_FINITE, NEGATIVE = 1, 2  # what ``entries_problem`` finds wrong


@compiled
def entries_problem(array):
    """``NOT_FINITE`` when an entry is NaN or ±inf, else ``NEGATIVE`` when one is below 0,
    else 0: one pass over the entries.  # [batch, vocab] float64 -> int"""
    finite, negative = True, False
    for value in array.flat:
        finite &= np.isfinite(value)
        negative |= value < 0.0
    if not finite:
        return NOT_FINITE
    return NEGATIVE if negative else 0


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


# -- elementary operations ---------------------------------------------------------------
def support_size(probs: np.ndarray) -> np.ndarray:
    """Number of tokens with positive probability per row.  # [batch, vocab] -> [batch]"""
    return np.count_nonzero(probs > 0, axis=1)


def total_variation(target_probs, draft_probs) -> np.ndarray:
    """TV = ½ Σ |p − q| along the last axis, any leading shape.  # [..., vocab] x2 -> [...]"""
    return 0.5 * np.abs(np.asarray(target_probs) - np.asarray(draft_probs)).sum(axis=-1)


def take(probs: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """probs[b, tokens[b]] for a column of tokens.  # [batch, vocab], [batch] -> [batch]"""
    return np.take_along_axis(probs, tokens[:, None], axis=-1)[:, 0]


def zeroed(probs: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Copy of ``probs`` with ``tokens`` [batch, k] set to zero (not renormalised)."""
    out = probs.copy()
    np.put_along_axis(out, tokens, 0.0, axis=-1)
    return out


def mass_of_the_others(probs: np.ndarray) -> np.ndarray:
    """For every token x, the mass of the other tokens of its row, Σ_{y≠x} q(y) — 1 − q(x)
    for a distribution. The row's largest token takes the explicit sum of the others, where
    the difference would cancel (q = 1 − 1e-9 leaves 1e-9 with 1e-7 relative error, a row
    storing q = 1.0 beside 1e-17 tokens leaves 0); at most one token exceeds half the mass,
    so every other difference is exact to rounding.  # [batch, vocab] -> [batch, vocab]"""
    probs = np.atleast_2d(probs)
    others = probs.sum(axis=1, keepdims=True) - probs
    largest = np.argmax(probs, axis=1)[:, None]
    np.put_along_axis(others, largest, zeroed(probs, largest).sum(axis=1, keepdims=True), axis=1)
    return others


@compiled
def largest_and_the_rest(values):
    """The total, the index of the largest value (the first of equal ones) and the sum of
    all the others, summed explicitly (``mass_of_the_others``' largest token, for compiled
    loops): one vector's, in order.  # [vocab] -> float, int, float"""
    total, largest = 0.0, 0
    for index in range(values.size):
        total += values[index]
        if values[index] > values[largest]:
            largest = index
    rest = 0.0
    for index in range(values.size):
        if index != largest:
            rest += values[index]
    return total, largest, rest


def normalize_mass(mass: np.ndarray, what: str = "residual") -> np.ndarray:
    """Renormalise non-negative ``mass`` rows; raise ZeroResidualError on an empty row."""
    totals = mass.sum(axis=-1, keepdims=True)
    if np.any(totals <= 0):
        raise ZeroResidualError(
            f"{what} distribution has zero mass; a correct verifier never samples it"
        )
    return mass / totals


def residual(target_probs: np.ndarray, draft_probs: np.ndarray) -> np.ndarray:
    """norm((p − q)+), the law of the token emitted after a rejection (SPEC.md §1)."""
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


def top_tokens(draft_probs, count: int):
    """The ``count`` most probable tokens per row, most probable first, ties to the lower
    id, without sorting the row: numpy rows in one pass keeping the ``count`` best
    (``most_probable``); torch tensors (the engine's, on any device) by top-k, which finds
    the count-th largest value, ties at it filled in id order.  # [batch, vocab] -> [batch, count]"""
    if isinstance(draft_probs, np.ndarray):
        if count > draft_probs.shape[-1]:
            raise ValueError(f"count: {count} tokens asked of a vocabulary of {draft_probs.shape[-1]}")
        return most_probable(np.ascontiguousarray(draft_probs, dtype=np.float64), count)
    import torch

    if count == 0:
        return torch.zeros((draft_probs.shape[0], 0), dtype=torch.long, device=draft_probs.device)
    if count < draft_probs.shape[-1]:
        values, indices = torch.topk(draft_probs, count + 1, dim=-1)
        if bool(torch.all(values[:, count - 1] > values[:, count])):  # no tie across the cut: the set is known
            tokens = torch.sort(indices[:, :count], dim=-1).values  # id order, as below
            order = torch.sort(draft_probs.gather(1, tokens), dim=-1, descending=True, stable=True).indices
            return tokens.gather(1, order)
        kth = values[:, count - 1 : count]
    else:
        kth = torch.topk(draft_probs, count, dim=-1).values[:, -1:]
    above, tied = draft_probs > kth, draft_probs == kth
    needed = count - above.sum(dim=-1, keepdim=True)
    chosen = above | (tied & (torch.cumsum(tied, dim=-1) <= needed))
    tokens = torch.nonzero(chosen)[:, 1].view(-1, count)  # id order within each row
    order = torch.sort(draft_probs.gather(1, tokens), dim=-1, descending=True, stable=True).indices
    return tokens.gather(1, order)


@compiled
def most_probable(probs, count):
    """``top_tokens`` of numpy rows: one pass per row over the tokens in id order, keeping the
    ``count`` best so far sorted by (probability descending, id ascending); a token enters
    only when strictly more probable than the last kept (an equal one has the higher id).
    O(V) where few tokens enter, O(V·count) at worst. Rows without NaN.
    # [batch, vocab] float64, count -> [batch, count] int64"""
    batch, vocab_size = probs.shape
    tokens = np.empty((batch, count), dtype=np.int64)
    values = np.empty(count)
    for row in range(batch):
        kept = 0
        for token in range(vocab_size):
            value = probs[row, token]
            if kept < count:
                slot = kept
                kept += 1
            elif count > 0 and value > values[count - 1]:
                slot = count - 1
            else:
                continue
            while slot > 0 and value > values[slot - 1]:
                values[slot], tokens[row, slot] = values[slot - 1], tokens[row, slot - 1]
                slot -= 1
            values[slot], tokens[row, slot] = value, token
    return tokens


@compiled
def ascending_order(keys):
    """The stable ascending order of floats ≥ +0 (∞ allowed, −0 not), where a NaN of the bits
    ``LAST_KEY_BITS`` sorts above ∞: the one sort of float keys of the exact computations
    (``bounds.subset.sort_by_ratio``, ``verifiers.rrs_exact``).

    A non-negative float's bits rise with its value: each key's bits above the lowest
    ``INDEX_BITS`` are packed with its index below them and sorted (``radix_sort_above_index``).
    Keys that agree above the index bits (within 2^-21 of each other) are then put in order
    by their lowest bits: a run of up to ``INSERTION_RUN`` keys (a real row's: 2–3) by
    insertion, a longer one the same way as the whole, each with its place in the run below
    them (a radix pass clears its bucket counts, 48 kB, whatever the run's length).
    # [k] -> [k] int"""
    count = keys.size
    bits = keys.view(np.uint64)
    index_bits, index_mask = np.uint64(INDEX_BITS), np.uint64((1 << INDEX_BITS) - 1)
    packed = np.empty(count, dtype=np.uint64)
    for place in range(count):
        packed[place] = ((bits[place] >> index_bits) << index_bits) | np.uint64(place)
    radix_sort_above_index(packed)
    order = np.empty(count, dtype=np.int64)
    start, tied = 0, False  # a run of keys equal above the index bits, and whether they are out of order
    for place in range(count):
        order[place] = np.int64(packed[place] & index_mask)
        if place > start:
            tied = tied or keys[order[place]] < keys[order[place - 1]]
        if place + 1 < count and (packed[place + 1] >> index_bits) == (packed[start] >> index_bits):
            continue
        if tied and place + 1 - start <= INSERTION_RUN:  # a few keys: by insertion, stable
            for end in range(start + 1, place + 1):
                token, slot = order[end], end
                while slot > start and bits[order[slot - 1]] > bits[token]:
                    order[slot] = order[slot - 1]
                    slot -= 1
                order[slot] = token
        elif tied:  # by the lowest bits, ties in index order (the run's order so far)
            run = np.empty(place + 1 - start, dtype=np.uint64)
            for within in range(run.size):
                run[within] = ((bits[order[start + within]] & index_mask) << index_bits) | np.uint64(within)
            radix_sort_above_index(run)
            for within in range(run.size):  # the run's tokens, in its new order
                run[within] = np.uint64(order[start + np.int64(run[within] & index_mask)])
            for within in range(run.size):
                order[start + within] = np.int64(run[within])
        start, tied = place + 1, False
    return order


@compiled
def radix_sort_above_index(packed):
    """Sorts ``packed`` in place by its bits above the lowest ``INDEX_BITS``, stably:
    least-significant-digit radix passes of ``RADIX_BITS`` (one counting pass for all
    digits; a digit that every key shares is skipped).  # [k] uint64"""
    count = packed.size
    digits = (64 - INDEX_BITS + RADIX_BITS - 1) // RADIX_BITS
    digit_mask = (1 << RADIX_BITS) - 1
    counts = np.zeros((digits, 1 << RADIX_BITS), dtype=np.int64)
    for place in range(count):
        high = np.int64(packed[place] >> np.uint64(INDEX_BITS))
        for digit in range(digits):
            counts[digit, (high >> (digit * RADIX_BITS)) & digit_mask] += 1
    keys, spare, swapped = packed, np.empty(count, dtype=np.uint64), False
    for digit in range(digits):
        shift = np.uint64(INDEX_BITS + digit * RADIX_BITS)
        if count == 0 or counts[digit, np.int64(keys[0] >> shift) & digit_mask] == count:
            continue
        start = 0
        for bucket in range(1 << RADIX_BITS):
            size = counts[digit, bucket]
            counts[digit, bucket] = start
            start += size
        for place in range(count):
            bucket = np.int64(keys[place] >> shift) & digit_mask
            spare[counts[digit, bucket]] = keys[place]
            counts[digit, bucket] += 1
        keys, spare, swapped = spare, keys, not swapped
    if swapped:
        for place in range(count):
            packed[place] = keys[place]


@compiled
def pairwise_sum(values, start, stop):
    """Σ values[start:stop] (a float64 vector) in numpy's own order, so that a compiled loop
    sums a row bit for bit as ``ndarray.sum`` does: numpy halves a run (the first half a
    multiple of 8 long) down to blocks of at most ``PAIRWISE_BLOCK`` values (``block_sum``)
    and adds the halves' sums. The halving runs on an explicit stack: a cached kernel
    calling a recursive one fails to link. Loops of other modules call it: their cache
    follows its source (``compiled``).  # [vocab], int, int -> float"""
    first, last = np.empty(64, dtype=np.int64), np.empty(64, dtype=np.int64)  # a run per level: 2^64 values
    left, left_done = np.empty(64), np.zeros(64, dtype=np.bool_)
    depth, first[0], last[0] = 0, start, stop
    while True:
        if last[depth] - first[depth] > PAIRWISE_BLOCK:  # descend into the first half
            first[depth + 1], last[depth + 1] = first[depth], _first_half_end(first[depth], last[depth])
            depth += 1
            left_done[depth] = False
            continue
        total = block_sum(values, first[depth], last[depth])
        while depth > 0:  # climb while the run summed is a second half
            depth -= 1
            if not left_done[depth]:  # it was a first half: keep it, sum the second
                left[depth], left_done[depth] = total, True
                first[depth + 1], last[depth + 1] = _first_half_end(first[depth], last[depth]), last[depth]
                depth += 1
                left_done[depth] = False
                break
            total = left[depth] + total
        else:
            return total


@compiled
def _first_half_end(start, stop):
    half = (stop - start) // 2
    return start + half - half % 8


@compiled
def block_sum(values, start, stop):
    """numpy's sum of a run of at most ``PAIRWISE_BLOCK`` values: from 8 on, eight
    accumulators taking every eighth value, added as ((a + b) + (c + d)) + ((e + f) + (g + h)),
    then the leftover values in turn; fewer than 8 in turn from −0.0. Read as a slice and
    eights of it, so that every index counts from 0 (a faster compiled loop).
    # [vocab], int, int -> float"""
    run = values[start:stop]
    if run.size < 8:
        total = -0.0
        for value in run:
            total += value
        return total
    a, b, c, d, e, f, g, h = run[0], run[1], run[2], run[3], run[4], run[5], run[6], run[7]
    whole = run.size - run.size % 8
    for first in range(8, whole, 8):
        eight = run[first : first + 8]
        a, b, c, d = a + eight[0], b + eight[1], c + eight[2], d + eight[3]
        e, f, g, h = e + eight[4], f + eight[5], g + eight[6], h + eight[7]
    total = ((a + b) + (c + d)) + ((e + f) + (g + h))
    for value in run[whole:]:
        total += value
    return total


# -- torch twins -------------------------------------------------------------------------
def sample_from_torch(weights, uniforms, needed=None):
    """Inverse-CDF sample per row from non-negative weights (``sample_from``'s twin);
    zero-weight tokens are never chosen. Rows where ``needed`` is False may have zero
    mass and return an arbitrary token. The running sums and the uniforms are in float32
    at least: in bf16 a sum over a vocabulary stalls once it nears 1, and bf16 uniforms
    lie on a grid of 2⁻⁸ there. ``uniforms`` of shape [batch, n] draw n tokens per row
    independently from one running sum (n draws with replacement).
    # weights [batch, vocab], uniforms [batch] or [batch, n], needed [batch] bool -> [batch] or [batch, n] long"""
    import torch

    cumulative = torch.cumsum(weights, dim=-1, dtype=torch.promote_types(weights.dtype, torch.float32))
    totals = cumulative[:, -1]
    empty = totals <= 0
    if bool(torch.any(empty if needed is None else needed & empty)):
        raise ZeroResidualError("residual distribution has zero mass; a correct verifier never samples it")
    columns = uniforms.reshape(uniforms.shape[0], -1).to(cumulative.dtype) * totals[:, None]
    vocab = weights.shape[-1]
    index = torch.searchsorted(cumulative, columns, right=True).clamp_(max=vocab - 1)
    # The first i with C(i) > u·total has C(i) > C(i − 1), so weight i > 0: a running sum of
    # non-negative terms does not grow by adding 0. Only a row of zero mass (allowed where
    # ``needed`` is False) runs past the end, clamped above onto a token that may weigh 0;
    # such rows take the last positive token, found only when one occurs (a pass over the
    # vocabulary saved). With u < 1 in the sums' dtype, u·total stays below a positive total.
    if bool(torch.any(weights.gather(1, index) <= 0)):
        last_positive = vocab - 1 - torch.argmax((weights.flip(-1) > 0).to(torch.uint8), dim=-1)
        index = torch.minimum(index, last_positive[:, None])
    return index[:, 0] if uniforms.dim() == 1 else index


def uniforms_torch(shape, generator, like):
    """Uniforms in [0, 1) of ``shape`` for drawing from ``like``'s rows: float32 at least
    (bf16 uniforms lie on a grid of 2⁻⁸ near 1), on ``like``'s device."""
    import torch

    return torch.rand(shape, generator=generator, dtype=torch.promote_types(like.dtype, torch.float32),
                      device=like.device)


def normalize_mass_torch(mass, rows):
    """Renormalise ``mass`` rows (``normalize_mass``'s twin); rows outside ``rows`` are
    left as they are, never divided by zero.  # [batch, vocab], [batch] bool -> [batch, vocab]"""
    import torch

    totals = mass.sum(dim=-1, keepdim=True)
    if bool(torch.any(rows & (totals[:, 0] <= 0))):
        raise ZeroResidualError("residual distribution has zero mass; a correct verifier never samples it")
    return mass / torch.where(totals > 0, totals, torch.ones_like(totals))
