"""Small context-dependent target/draft models for exact-enumeration tests of the tree
verifiers and the multi-step optimum, and the emitted-sequence law (losslessness).

A model is a callable ``prefix -> [vocab]`` whose row is drawn from a Dirichlet law seeded
by (seed, prefix), so it is a deterministic function of the prefix. Rows may have zeros
and may be point masses; an optional EOS-like token is absorbing (after it the row is the
point mass on it). Letters: p = target, q = draft (SPEC.md §0).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st

from specbound.verifiers import get_verifier
from specbound.verifiers.enumeration import SequenceLaws, TreeDrafter
from specbound.verifiers.tree import ScoredTree

# derandomised whatever the profile: the same examples on every run
DERANDOMIZED = settings(derandomize=True, database=None, max_examples=30, deadline=None)
# token-wise verification in the setting of each draft scheme: RRS with its scheme's draws
TOKENWISE = {"with_replacement": get_verifier("rrs"), "without_replacement": get_verifier("rrs_without_replacement")}


def one_hot(vocab: int, token: int) -> np.ndarray:
    row = np.zeros(vocab)
    row[token] = 1.0
    return row


def random_model(seed: int, vocab: int, *, zero_prob: float = 0.25, point_mass_prob: float = 0.15,
                 concentration: float = 0.8, eos: int | None = None):
    @lru_cache(maxsize=None)
    def probs(prefix: tuple[int, ...]) -> np.ndarray:
        rng = np.random.default_rng([seed, len(prefix), *prefix])
        if eos is not None and prefix[-1] == eos:
            row = one_hot(vocab, eos)
        elif rng.random() < point_mass_prob:
            row = one_hot(vocab, int(rng.integers(vocab)))
        else:
            row = rng.dirichlet(np.full(vocab, concentration))
            zeroed = rng.random(vocab) < zero_prob
            zeroed[int(np.argmax(row))] = False
            row[zeroed] = 0.0
            row = row / row.sum()
        row.setflags(write=False)
        return row

    return probs


def constant_model(row):
    """A context-free model: the same row after every prefix."""
    fixed = np.asarray(row, dtype=np.float64)
    fixed.setflags(write=False)
    return lambda prefix: fixed


# context-free, V = 2, γ = 2: p = (1/3, 2/3), q = (2/3, 1/3) (SPEC.md §7.1)
TWO_TOKEN = TreeDrafter(constant_model([1 / 3, 2 / 3]), constant_model([2 / 3, 1 / 3]), (1, 1))


def emitted_sequence_law(tree: ScoredTree, outcome_law: np.ndarray, targets: SequenceLaws, length: int):
    """Law ``[vocab] * length`` of (accepted path, next token) continued by the target.
    # outcome_law [nodes, vocab]: P(last accepted node u, next token y | tree)"""
    law = np.zeros((tree.vocab_size,) * length)
    for node in range(tree.num_nodes):
        path = tree.path_tokens(node)
        for token in np.flatnonzero(outcome_law[node] != 0):
            emitted = path + (int(token),)
            continuation = targets.law(tree.prefix(node) + (int(token),), length - len(emitted))
            law[emitted] += outcome_law[node, token] * continuation
    return law


def lossless_error(drafter: TreeDrafter, outcome_law, root_token: int = 0) -> float:
    """max_z |Σ_t D(t)·(emitted law of t)(z) − P_target(z)| over sequences z of length d + 1:
    the verifier's randomness integrated out by its exact ``outcome_law(tree)``, the drafts
    by enumeration. A step shorter than d (an EOS-like token, a ragged shape) is continued
    by the target like any other."""
    trees = drafter.enumerate(root_token)
    length = max(tree.max_depth for _, tree in trees) + 1
    targets = SequenceLaws(drafter.target_probs)
    emitted = sum(p * emitted_sequence_law(tree, outcome_law(tree), targets, length) for p, tree in trees)
    return float(np.abs(emitted - targets.law((root_token,), length)).max())


def chain_drafters() -> dict[str, TreeDrafter]:
    """Context-dependent chains: V = 3–4, γ = 1..3, zeros, point masses, EOS-like tokens (the
    draft absorbing at EOS or not)."""
    cases = {}
    for seed in range(12):
        vocab, gamma = 3 + seed % 2, 1 + seed % 3
        eos = vocab - 1 if seed % 4 == 3 else None
        draft_eos = eos if seed % 8 == 3 else None
        name = f"chain-s{seed}-V{vocab}-g{gamma}" + ("-eos" if eos is not None else "")
        cases[name] = TreeDrafter(random_model(seed, vocab, eos=eos), random_model(500 + seed, vocab, eos=draft_eos),
                                  (1,) * gamma)
    return cases


def ragged(prefix: tuple[int, ...]) -> int:
    """A token-dependent shape: the root draws 2; only a child with token 0 is expanded (1 draw)."""
    return 2 if len(prefix) == 1 else (1 if len(prefix) == 2 and prefix[-1] == 0 else 0)


def tree_drafters() -> dict[str, TreeDrafter]:
    """Context-dependent trees, both sequential schemes, shapes up to depth 3, a ragged one."""
    shapes = [(2, 1), (2, 2), (3, 1), (2, 1, 1), (1, 2), ragged]
    cases = {}
    for seed in range(12):
        for scheme in ("with_replacement", "without_replacement"):
            shape = shapes[seed % len(shapes)]
            vocab = 3 if shape in ((2, 2), (2, 1, 1)) else 3 + seed % 2
            eos = vocab - 1 if seed % 3 == 2 else None
            label = "ragged" if callable(shape) else "x".join(map(str, shape))
            name = f"tree-s{seed}-V{vocab}-{label}-{scheme[:7]}" + ("-eos" if eos is not None else "")
            cases[name] = TreeDrafter(random_model(seed, vocab, eos=eos), random_model(700 + seed, vocab),
                                      shape, scheme)
    return cases


CHAINS = chain_drafters()
TREES = tree_drafters()


@st.composite
def probability_rows(draw, vocab: int):
    """A probability row [vocab] with zeros and unequal weights."""
    row = np.array(draw(st.lists(st.sampled_from([0.0, 0.05, 0.3, 1.0, 2.5]), min_size=vocab, max_size=vocab)))
    if row.sum() == 0:
        row[draw(st.integers(0, vocab - 1))] = 1.0
    return row / row.sum()
