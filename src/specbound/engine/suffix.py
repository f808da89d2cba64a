"""Suffix decoding: draft trees from what followed earlier occurrences of the context's
suffix, in the request itself and in earlier outputs (after Oliaro et al. 2024,
"SuffixDecoding", arXiv 2411.04975; SPEC.md §6, deterministic drafts).

**The structure.** A ``SuffixText`` is a token sequence with two indexes, pair of
consecutive tokens → positions and token → positions. The drafter reads two kinds: the
current request's context (its prompt and the tokens emitted so far, indexed as it grows)
and a ``SuffixHistory`` of earlier outputs, each kept with the ``max_match`` tokens before
it, oldest first, at most ``max_tokens`` tokens in all (the oldest outputs evicted). At each
step the drafter finds the occurrences of the longest suffix of the context (at most
``max_match`` tokens, at least ``min_match``) in both, and counts what followed them: the
counts at the nodes of the suffix tree below the matched suffix, up to the step's depth
(``continuations``). Occurrences are looked up by the context's last two tokens; where those
occur nowhere, by its last token alone (a match of one token, whose many occurrences
usually branch: where a tree gains most over its chain).

**The tree.** The drafted tree holds the chain of the most frequent continuation, then the
other likeliest ones, best first by count(node) / count(matched suffix) — the product of
the count ratios along the path, the history's estimate of reaching the node — within the
method's shape: at most
``branching[depth]`` children per node (``Levels``: a chain takes the most frequent path),
or a budget of nodes, width per depth and children per node (``Budget``); where the history
never branches the tree is a chain.

**The draft law and its verification.** A node with children S is given the draft law
q(x) = count(x) / count(S) on S, and its drafts are drawn from q with the method's scheme:
one child is the point mass (prompt lookup's case); for several, a scheme of distinct
tokens draws exactly the set S (without replacement: S in an order drawn from q; greedy:
S in order of count). The tree shape and q are functions of the context and the history,
never of the target or the verifier's randomness, so every lossless verifier of the
scheme stays lossless (``engine.methods``' budgeted-tree argument).

They are also optimal. The drafted set at a node is S whatever the draws, and a lossless
verifier emits y with law p = p(·|node), so it descends into child x with probability
exactly p(x) and accepts with p(S) — the most any rule can when the drafts are the fixed set
S. Below, the subtree is again fixed, so token-wise verification reaches every node v with
probability p(path to v), the product of the target's probabilities along v's path, and
E[accepted drafts | tree] = Σ_{v ≠ root} p(path to v): no lossless verifier of a fixed tree
accepts more, since the emitted sequence has the target's law and accepting v's path needs
it to begin with that path. Drawn without replacement, the children come in an order drawn
from q, and the exact E[accepted | tree] a step records (``RunStats.expected_lengths``) is
exact given that order and varies with it, per-node verification and traversal alike;
averaged over the order it is the figure above. Greedy draws them in order of count: every
step's is that figure.

**History and batches.** A sequence drafts from the history as it stood when the drafter
first drafted for it (a snapshot of the list of outputs, kept while it runs, so that an
eviction meanwhile changes nothing for it); its output from then on joins the history when
it leaves the batch (under ``auto``, a sequence never drafted by suffix adds nothing). Sequences finishing beside it never change its drafts, so a batch changes no
sequence's tokens. Memory: the history holds at most ``max_tokens`` tokens, plus the
evicted outputs that a sequence still running keeps in its snapshot.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

import torch

from specbound.checks import positive_int
from specbound.drafts import get_draft_scheme
from specbound.engine.drafters import draw_drafts
from specbound.engine.methods import Levels
from specbound.engine.processing import PROBS_DTYPE
from specbound.engine.tree import DraftTree

MAX_HISTORY_TOKENS = 65_536  # earlier outputs kept (with their preceding max_match tokens), oldest evicted first
MAX_MATCH = 16  # the longest suffix of the context looked for
MIN_MATCH = 1  # a shorter match drafts nothing: at 1, the last token alone, where no two-token suffix occurs
MAX_OCCURRENCES = 256  # occurrences of the context's last two tokens (else its last one) examined per step in the
# request, and again in the history, newest first


class SuffixText:
    """A token sequence and, for each pair of consecutive tokens and for each token, the
    positions where it ends and a continuation follows (every position from ``first`` on but
    the last). ``extend`` appends."""

    def __init__(self, tokens=(), first: int = 0):
        self.tokens: list[int] = []
        self.first = first  # positions before it are context only: matched against, never continued from
        self._positions: dict[tuple[int, int], list[int]] = {}
        self._token_positions: dict[int, list[int]] = {}
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens) -> None:
        start = max(self.first, len(self.tokens) - 1, 0)
        self.tokens.extend(int(token) for token in tokens)
        for position in range(start, len(self.tokens) - 1):
            self._token_positions.setdefault(self.tokens[position], []).append(position)
            if position:
                self._positions.setdefault((self.tokens[position - 1], self.tokens[position]), []).append(position)

    def occurrences(self, suffix: tuple[int, ...], limit: int) -> list[int]:
        """The latest ``limit`` positions where ``suffix`` (two tokens, or one) ends and a
        continuation follows, newest first."""
        positions = self._positions.get(suffix, []) if len(suffix) == 2 else self._token_positions.get(suffix[0], [])
        return positions[: -limit - 1 : -1]

    def match_length(self, position: int, context: list[int], max_match: int) -> int:
        """How many tokens ending at ``position`` equal the end of ``context`` (at most ``max_match``)."""
        length, tokens = 0, self.tokens
        while length < max_match and length <= position and length < len(context) \
                and tokens[position - length] == context[-1 - length]:
            length += 1
        return length


class SuffixHistory:
    """Earlier outputs, each with the ``max_match`` tokens before it, at most ``max_tokens``
    tokens in all: adding past the cap evicts the oldest outputs (module docstring)."""

    def __init__(self, max_tokens: int = MAX_HISTORY_TOKENS, max_match: int = MAX_MATCH):
        self.max_tokens = positive_int("max_tokens", max_tokens)
        self.max_match = positive_int("max_match", max_match)
        self._texts: deque[SuffixText] = deque()
        self.num_tokens = 0

    def __len__(self) -> int:
        return len(self._texts)

    def add(self, output, before=()) -> None:
        """Keep ``output`` (token ids), matched together with the end of ``before`` (the
        context it followed); an output longer than the cap keeps its last tokens."""
        output = [int(token) for token in output][-self.max_tokens:]
        if not output:
            return
        kept = min(self.max_match, self.max_tokens - len(output), len(before))
        before = [int(token) for token in before[len(before) - kept:]]
        text = SuffixText(before + output, first=max(len(before) - 1, 0))
        self._texts.append(text)
        self.num_tokens += len(text)
        while self.num_tokens > self.max_tokens:
            self.num_tokens -= len(self._texts.popleft())

    def snapshot(self) -> tuple[SuffixText, ...]:
        """The outputs kept now, oldest first; later additions and evictions leave it as it is."""
        return tuple(self._texts)


@dataclass
class _Row:
    """The drafter's view of one sequence: its context (the decoder's own list, which grows
    as tokens are emitted), where its output began, and its history snapshot."""

    context: list[int]
    start: int
    history: tuple[SuffixText, ...]
    text: SuffixText = field(init=False)

    def __post_init__(self):
        self.text = SuffixText(self.context)

    def sources(self) -> list[list[SuffixText]]:
        """The context brought up to date; the history, newest first."""
        self.text.extend(self.context[len(self.text):])
        return [[self.text], list(reversed(self.history))]


def continuations(sources: list[list[SuffixText]], context: list[int], depth: int, max_match: int = MAX_MATCH,
                  min_match: int = MIN_MATCH, max_occurrences: int = MAX_OCCURRENCES) -> tuple[int, dict]:
    """The suffix tree's counts below the longest suffix of ``context`` found in the texts of
    ``sources`` (at most ``max_occurrences`` occurrences of its last two tokens examined in each
    source, in order; where the two occur nowhere and ``min_match`` is 1, of its last token):
    (its number of occurrences, a trie token → [count, trie] of what followed them, at most
    ``depth`` tokens deep). (0, {}) where no suffix of ``min_match`` tokens occurs."""
    found, longest = [], 0
    for suffix in (tuple(context[-2:]), tuple(context[-1:])) if len(context) >= 2 else (tuple(context),):
        if len(suffix) < min_match or not suffix:
            break
        for texts in sources:
            examined = 0
            for text in texts:
                positions = text.occurrences(suffix, max_occurrences - examined)
                examined += len(positions)
                for position in positions:
                    length = text.match_length(position, context, max_match)
                    if length > longest:
                        found, longest = [], length
                    if length == longest:
                        found.append((text, position))
                if examined >= max_occurrences:
                    break
        if found:
            break
    if longest < min_match:
        return 0, {}
    trie: dict = {}
    for text, position in found:
        node = trie
        for token in text.tokens[position + 1 : position + 1 + depth]:
            entry = node.setdefault(token, [0, {}])
            entry[0] += 1
            node = entry[1]
    return len(found), trie


def best_first(trie: dict, total: int, shape, depth: int) -> list[tuple[int, int, int]]:
    """The drafted nodes as (parent, token, count), parents first, within the method's
    ``shape`` (module docstring) and ``depth``: first the chain — the most frequent child at
    each depth, the newer occurrence's of equal ones, what ``Levels((1,) * depth)`` drafts —
    then the other trie nodes best first by count / ``total``, the deeper first of equal
    counts. A budgeted tree thus holds the chain wherever its budget and width allow, and
    accepts at least as much as the chain in expectation. Node 0 is the root; the i-th entry
    is node i + 1."""
    chain, node = set(), trie
    for _ in range(depth):
        if not node:
            break
        entry = max(node.values(), key=lambda entry: entry[0])  # the first (newest) of the most frequent
        chain.add(id(entry))
        node = entry[1]
    budget = not isinstance(shape, Levels)
    room = shape.nodes if budget else None
    width: dict[int, int] = {}
    children = [0]
    chosen = []
    frontier = [(id(entry) not in chain, -entry[0], -1, order, 0, token, entry[1])
                for order, (token, entry) in enumerate(trie.items())]
    heapq.heapify(frontier)
    order = len(frontier)
    while frontier and (room is None or len(chosen) < room):
        _, negative, negative_level, _, parent, token, below = heapq.heappop(frontier)
        level = -negative_level
        limit = shape.max_children if budget else shape.branching[level - 1]
        if children[parent] >= limit or (budget and (
                width.get(level, 0) >= shape.width or -negative / total <= shape.min_value)):
            continue
        children[parent] += 1
        width[level] = width.get(level, 0) + 1
        chosen.append((parent, token, -negative))
        children.append(0)
        if level < depth:
            for token, entry in below.items():
                heapq.heappush(frontier, (id(entry) not in chain, -entry[0], -level - 1, order, len(chosen), token,
                                          entry[1]))
                order += 1
    return chosen


def check_method(method) -> None:
    """Refuse (ValueError naming ``method``) a method that may give a node several suffix
    drafts under a scheme of independent draws: the children of a node are a fixed set, which
    only a scheme of distinct tokens draws (module docstring)."""
    shape = method.shape
    for depth in range(method.depth):
        several = shape.branching[depth] > 1 if isinstance(shape, Levels) else shape.max_children > 1
        scheme = method.scheme_at(depth)
        if several and not get_draft_scheme(scheme).needs_distinct_support:
            raise ValueError(f"method: suffix drafts are a fixed set at each node; {method.name} draws {scheme}: "
                             "verify them with a verifier whose drafts are distinct tokens "
                             "(rrs_without_replacement, greedy, traversal)")


class SuffixDrafter:
    """Suffix decoding's drafter (module docstring): drafts cost no forward, and its trees
    are drawn from point-mass-like count laws with the method's scheme.

    ``history``: the earlier outputs it drafts from and adds each finished sequence's output
    to (shared by several drafters, e.g. a server's decoders; default a new one)."""

    language_models: list = []  # none: the drafts come from the context and the history

    def __init__(self, vocab_size: int, history: SuffixHistory | None = None, max_match: int = MAX_MATCH,
                 min_match: int = MIN_MATCH, max_occurrences: int = MAX_OCCURRENCES, device="cpu"):
        self.vocab_size = positive_int("vocab_size", vocab_size)
        self.history = history if history is not None else SuffixHistory(max_match=max_match)
        if not isinstance(self.history, SuffixHistory):
            raise TypeError(f"history: expected a SuffixHistory or None, got {type(history).__name__}")
        self.max_match = positive_int("max_match", max_match)
        self.min_match = positive_int("min_match", min_match)
        if not self.min_match <= self.max_match:
            raise ValueError(f"min_match, max_match: need 1 <= min_match <= max_match, got {min_match}, {max_match}")
        self.max_occurrences = positive_int("max_occurrences", max_occurrences)
        self.device = torch.device(device)
        self._rows: list[_Row | None] = []

    def reset(self, prompts: list[list[int]], cells: int | None = None) -> None:
        """Start a batch: each row's view is made when it is first drafted for."""
        self._rows = [None] * len(prompts)

    def draft(self, contexts, method, depths, generators, processings=None) -> list[DraftTree]:
        """One tree per sequence below its last token, at most ``depths[b]`` deep; the
        drafts do not depend on the sampling, so ``processings`` changes nothing."""
        check_method(method)
        self._rows += [None] * (len(contexts) - len(self._rows))  # rows that joined since
        trees = []
        for b, (context, depth) in enumerate(zip(contexts, depths)):
            row = self._rows[b]
            if row is None or row.context is not context:
                row = self._rows[b] = _Row(context, len(context), self.history.snapshot())
            trees.append(self.draft_one(row.sources(), context, method, depth, generators[b]))
        return trees

    def draft_one(self, sources: list[list[SuffixText]], context: list[int], method, depth: int,
                  generator: torch.Generator) -> DraftTree:
        """The tree below ``context``'s last token drafted from ``sources`` (``continuations``)."""
        tree = DraftTree.root_only(context[-1])
        if depth <= 0:
            return tree
        total, trie = continuations(sources, context, depth, self.max_match, self.min_match, self.max_occurrences)
        planned = best_first(trie, total, method.shape, depth) if total else []
        below: list[dict[int, int]] = [{} for _ in range(len(planned) + 1)]  # plan node -> {child's token: count}
        planned_index = {}  # (plan node, token) -> plan node of that child
        for node, (parent, token, count) in enumerate(planned, start=1):
            below[parent][token] = count
            planned_index[(parent, token)] = node
        tree_node = {0: 0}  # plan node -> tree node
        internal = [node for node, counts in enumerate(below) if counts]  # parents first
        rows = torch.zeros((len(internal), self.vocab_size), dtype=PROBS_DTYPE, device=self.device)  # one allocation
        for draft_probs, node in zip(rows, internal):  # draft_probs [vocab]
            counts = below[node]
            children = torch.tensor(list(counts), device=self.device)
            child_probs = torch.tensor(list(counts.values()), dtype=PROBS_DTYPE, device=self.device)
            child_probs /= child_probs.sum()  # [children]: q on the node's children
            draft_probs[children] = child_probs
            scheme = method.scheme_at(tree.depths[tree_node[node]])
            drafts = children if len(children) == 1 else children[draw_drafts(scheme, len(children), child_probs,
                                                                             generator)]
            for child in tree.expand(tree_node[node], draft_probs, drafts, scheme):
                tree_node[planned_index[(node, tree.tokens[child])]] = child
        return tree

    def commit(self, trees, paths) -> None:
        """Nothing to keep: each row's context is read again at its next step."""

    def select_rows(self, rows: list[int]) -> None:
        """Keep ``rows``; the outputs of the rows that leave join the history."""
        kept = set(rows)
        for b, row in enumerate(self._rows):
            if b not in kept and row is not None:
                self.history.add(row.context[row.start:], row.context[: row.start])
        self._rows = [self._rows[b] if b < len(self._rows) else None for b in rows]
