"""Generated (target, draft) pairs for property-based tests (hypothesis), with the edge
cases where floating point and 0/0 bite: disjoint supports, point masses on either side,
p = q exactly and up to one ulp, a token with a tiny (down to subnormal) probability, a
dominant token stored as 1.0 beside tiny ones, and rows that sum to 1 only within float32
rounding. Letters: p = target, q = draft (SPEC.md §0)."""

import numpy as np
from hypothesis import strategies as st

PAIR_KINDS = (
    "dirichlet", "target_point", "draft_point", "disjoint", "equal", "equal_up_to_rounding",
    "tiny_draft", "tiny_target", "dominant_draft", "dominant_target", "float32",
)
EXACT_KINDS = ("dirichlet", "target_point", "draft_point", "disjoint", "equal")  # no rounding-level masses
TINY = (1e-9, 1e-17, 1e-30, 1e-200, 1e-310, 5e-324)


def _row(rng, vocab, support, concentration):
    """A Dirichlet row on ``support`` tokens chosen at random (the rest exactly 0)."""
    row = np.zeros(vocab)
    tokens = rng.choice(vocab, size=support, replace=False)
    row[tokens] = rng.dirichlet(np.full(support, concentration))
    row[tokens[0]] += 1.0 - row.sum()  # sums to 1 to rounding, never below 0 here
    return np.maximum(row, 0.0)


@st.composite
def distribution_pairs(draw, max_vocab=6, kinds=PAIR_KINDS, concentrations=(0.2, 1.0, 5.0)):
    """(target [V], draft [V]) float64 rows of one edge-case kind of ``kinds``, Dirichlet
    rows of one of ``concentrations``; each row sums to 1 within 1e-6 (not always exactly:
    the checked inputs renormalise it)."""
    vocab = draw(st.integers(2, max_vocab))
    kind = draw(st.sampled_from(kinds))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    concentration = draw(st.sampled_from(concentrations))

    def row(min_support=1):
        return _row(rng, vocab, draw(st.integers(min_support, vocab)), concentration)

    def point():
        return np.eye(vocab)[draw(st.integers(0, vocab - 1))]

    if kind == "dirichlet":
        return row(), row()
    if kind == "target_point":
        return point(), row()
    if kind == "draft_point":
        return row(), point()
    if kind == "disjoint":
        split = draw(st.integers(1, vocab - 1))
        order = rng.permutation(vocab)
        target, draft = np.zeros(vocab), np.zeros(vocab)
        target[order[:split]] = rng.dirichlet(np.full(split, concentration))
        draft[order[split:]] = rng.dirichlet(np.full(vocab - split, concentration))
        return target, draft
    if kind == "equal":
        target = row()
        return target, target.copy()
    if kind == "equal_up_to_rounding":
        target = row()
        draft = target.copy()
        for token in draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=2, unique=True)):
            draft[token] = np.nextafter(draft[token], 1.0 if draw(st.booleans()) else 0.0)
        return target, draft
    if kind in ("tiny_draft", "tiny_target"):
        tiny_row = row(min_support=2)
        token = int(np.argmin(tiny_row))  # the rest keeps mass
        tiny_row[token] = 0.0
        tiny_row /= tiny_row.sum()
        tiny_row[token] = draw(st.sampled_from(TINY))
        other = row()
        return (other, tiny_row) if kind == "tiny_draft" else (tiny_row, other)
    if kind in ("dominant_draft", "dominant_target"):
        dominant = np.zeros(vocab)
        dominant[rng.permutation(vocab)[: draw(st.integers(1, vocab - 1))]] = draw(st.sampled_from(TINY))
        dominant[draw(st.integers(0, vocab - 1))] = 1.0
        return (row(), dominant) if kind == "dominant_draft" else (dominant, row())
    return row().astype(np.float32).astype(np.float64), row().astype(np.float32).astype(np.float64)
