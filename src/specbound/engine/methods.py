"""Decoding methods: the shape of each step's draft tree and who verifies it.

One engine runs them all (``specbound.engine.decode``). A method says how many drafts each
node of the tree gets — fixed per depth (``Levels``) or decided per node against a node
budget (``Budget``) — from which draft scheme, and which verifier of the registry
(``specbound.verifiers``) decides: a per-node verifier at each depth, walking top-down, or
one verifier over the whole drafted tree (block, traversal, univer).

| method           | drafts per node                   | verifier                                  | source       |
|------------------|-----------------------------------|-------------------------------------------|--------------|
| autoregressive   | (none)                            | (a token from p each step)                |              |
| chain            | 1 at each of γ depths             | single (token-wise) or block              | [LEV], [BLOCK] |
| tree             | n at each of d depths             | any per-node verifier, or traversal / univer | [HU], [GR], [TRAVERSAL], [UNIVER] |
| sparse           | decided per node, budget of nodes | a per-node verifier with its scheme, or traversal | EAGLE-2-style |
| batch            | M, then 1, ..., 1 (γ)             | rrs at the root, then single              | [YIN] §2     |
| decoding_opt/uno | 1 at each of γ depths             | decoding_opt / decoding_uno with ε        | [YIN] §3     |

Batch SD [YIN Alg. 4]: M independent draft continuations; the M root tokens are tried in
turn by recursive rejection (RRS with replacement), and once one is accepted only its
continuation is verified, by plain speculative sampling. Drafting the M roots i.i.d. and
one chain below each distinct root is that algorithm: continuations below equal roots are
i.i.d., so sharing one changes no law.

**Why a budgeted tree stays lossless.** Each node's number of children k is decided before
its children are drawn, from the draft probabilities along the tree drafted so far (never
from the children themselves, nor from the target or the verifier's randomness). Given the
node's prefix and k, its k children are a draw of the registered scheme from
q(·|prefix), so the per-node verifier — lossless for that scheme at every fixed count —
emits a token with law p(·|prefix) whatever k was; averaging over k changes nothing. The
subtree below a child is drafted after the child's token is fixed and independently of the
verifier's randomness, so descending into it keeps the argument going (SPEC.md §6). A rule
that looked at the drawn children to decide how many to keep (drawing "until the mass
covered reaches 0.9", or pruning drawn children by their probability) would change the
drafts' joint law and is not what ``Budget`` does.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from specbound.checks import finite_number, positive_int
from specbound.engine.drafted import check_drafted
from specbound.verifiers import Verifier, get_verifier
from specbound.verifiers.tree import ScoredTree, TreeVerifier, tokenwise_expected_accepted

if TYPE_CHECKING:
    import torch

@dataclass(frozen=True)
class Levels:
    """A fixed number of drafts per node at each depth."""

    branching: tuple[int, ...]  # drafts per node at depth 0, 1, ..., d − 1

    @property
    def max_depth(self) -> int:
        return len(self.branching)

    @property
    def max_nodes(self) -> int:
        nodes, width = 0, 1
        for count in self.branching:
            width *= count
            nodes += width
        return nodes

    def counts(self, depth: int, reach: list[float], draft_probs: torch.Tensor, nodes: int) -> list[int]:
        return [self.branching[depth]] * len(reach)


@dataclass(frozen=True)
class Budget:
    """Children decided per node before they are drawn, the tree grown to ``nodes`` nodes.

    At each depth the candidates are (frontier node v, child rank j) with value
    reach(v)·q_(j)(v) — reach(v) the product of the draft probabilities along v's path,
    q_(j)(v) the j-th largest probability of v's draft law — the drafter's estimate of how
    likely verification reaches that child (EAGLE-2's proxy). The best candidates are kept,
    at most ``width`` per depth, ``max_children`` per node and ``nodes`` in all; a node's
    count is its number of kept candidates (a prefix of its ranks, since q_(j) falls with j).
    Candidates worth less than ``min_value`` are not drafted."""

    nodes: int
    max_depth: int
    width: int
    max_children: int
    min_value: float = 0.0

    @property
    def max_nodes(self) -> int:
        return self.nodes

    def counts(self, depth: int, reach: list[float], draft_probs: torch.Tensor, nodes: int) -> list[int]:
        """Children per frontier node.  # reach [frontier], draft_probs [frontier, vocab]"""
        import torch  # here: the methods' registry is read (the command line's checks) without torch

        room = min(self.width, self.nodes - nodes)
        if room <= 0:
            return [0] * len(reach)
        ranks = min(self.max_children, draft_probs.shape[-1])
        top = torch.topk(draft_probs.float(), ranks, dim=-1).values  # [frontier, ranks], falling
        values = torch.tensor(reach, dtype=torch.float32)[:, None] * top
        flat = values.flatten()
        chosen = torch.topk(flat, min(room, flat.numel())).indices
        chosen = chosen[flat[chosen] > self.min_value]
        counts = torch.bincount(chosen // ranks, minlength=len(reach))
        return counts.tolist()


@dataclass(frozen=True)
class Method:
    name: str
    shape: Levels | Budget
    verifiers: tuple  # per depth: the per-node verifier deciding there; () when tree_verifier decides
    tree_verifier: TreeVerifier | None = None  # a verifier of the whole drafted tree (block, traversal)
    drafter: str = "model"  # who drafts its trees: "model" (the draft model) or "lookup" (prompt lookup)
    adaptive = False  # a fixed method learns nothing from the steps it runs (``Schedule``)

    def __post_init__(self):
        if self.tree_verifier is not None:
            if self.verifiers:
                raise ValueError("verifiers: a method verified as a whole tree has no per-node verifiers")
            return
        if len(self.verifiers) != self.shape.max_depth:
            raise ValueError(f"verifiers: one per depth expected ({self.shape.max_depth}), got {len(self.verifiers)}")
        if isinstance(self.shape, Levels):
            for depth, (num_drafts, verifier) in enumerate(zip(self.shape.branching, self.verifiers)):
                positive_int("branching", num_drafts)
                verifier.check_num_drafts(num_drafts)

    @property
    def depth(self) -> int:
        return self.shape.max_depth

    @property
    def max_nodes(self) -> int:
        """The most drafted nodes one step's tree may hold."""
        return self.shape.max_nodes

    @property
    def lossless(self) -> bool:
        deciders = self.verifiers if self.tree_verifier is None else (self.tree_verifier,)
        return all(verifier.lossless for verifier in deciders)

    def scheme_at(self, depth: int) -> str:
        """The draft scheme of the nodes at ``depth``."""
        return (self.tree_verifier or self.verifiers[depth]).scheme

    def verifier_at(self, depth: int, num_drafts: int) -> Verifier:
        """The verifier for a node at ``depth`` that got ``num_drafts`` drafts
        (``Verifier.for_num_drafts``)."""
        return self.verifiers[depth].for_num_drafts(num_drafts)

    def expected_accepted(self, drafted: ScoredTree) -> float:
        """Exact E[accepted drafts | the drafted tree] of this method's verification
        (SPEC.md §7.3): its whole-tree verifier's, or top-down with its verifier at each depth."""
        if self.tree_verifier is not None:
            return float(self.tree_verifier.expected_accepted(drafted))
        return tokenwise_expected_accepted(drafted, self.verifier_at)

    # -- a fixed method is its own schedule (``Schedule``) ------------------------------------
    def method_for(self, step: int) -> Method:
        """The method of every step: this one."""
        return self

    def observe(self, method: Method, tree, accepted_path: list[int], target_rows=None) -> None:
        """A fixed method learns nothing from the steps it ran."""

    plans_made = 0  # a fixed method makes no plans

    def describe(self, since: int = 0) -> str:
        """A fixed method has no plans to describe."""
        return ""


class Schedule(Protocol):
    """What a decoder runs: the method of each step. A fixed ``Method`` is its own schedule;
    the ``engine.planner.Planner`` (``--method auto``) chooses step by step and learns from
    the steps it ran (``observe``)."""

    name: str
    adaptive: bool  # whether its methods follow what it learns from the steps run (the planner's do)

    @property
    def depth(self) -> int: ...  # the deepest tree any of its methods drafts

    @property
    def max_nodes(self) -> int: ...  # the largest tree any of its methods drafts

    def method_for(self, step: int) -> Method: ...

    def observe(self, method: Method, tree, accepted_path: list[int], target_rows=None) -> None: ...

    plans_made: int  # plans made so far (``describe``'s ``since``)

    def describe(self, since: int = 0) -> str: ...  # the plans made after the first ``since``


def autoregressive() -> Method:
    """One target call per token, sampled from p."""
    return Method("autoregressive", Levels(()), ())


def _verifier(name: str):
    verifier = get_verifier(name)
    return verifier, getattr(verifier, "per_node", True)


def chain(gamma: int = 3, verifier: str = "single") -> Method:
    """Single draft, lookahead γ, bonus token when all γ are accepted (SPEC.md §6); verified
    token by token (``single``) or as a block (``block``, [BLOCK])."""
    gamma = positive_int("gamma", gamma)
    check_drafted("chain", gamma=gamma)
    chosen, per_node = _verifier(verifier)
    label = f"chain γ={gamma}" + ("" if verifier == "single" else f" {verifier}")
    if per_node:
        return Method(label, Levels((1,) * gamma), (chosen,) * gamma)
    return Method(label, Levels((1,) * gamma), (), chosen)


def tree(num_drafts: int = 2, depth: int = 2, verifier: str = "rrs_without_replacement") -> Method:
    """``num_drafts`` children per node from the verifier's draft scheme, ``depth`` levels."""
    chosen, per_node = _verifier(verifier)
    check_drafted("tree", positive_int("num_drafts", num_drafts), positive_int("depth", depth))
    branching = (num_drafts,) * depth
    label = f"tree {num_drafts}×{depth} {verifier}"
    if per_node:
        return Method(label, Levels(branching), (chosen,) * depth)
    return Method(label, Levels(branching), (), chosen)


def sparse(budget: int = 16, depth: int = 5, width: int = 4, max_children: int = 4,
           verifier: str = "rrs_without_replacement") -> Method:
    """A tree grown to ``budget`` nodes, at most ``depth`` deep and ``width`` nodes per
    depth, each node's children decided before they are drawn (``Budget``)."""
    chosen, per_node = _verifier(verifier)
    shape = Budget(positive_int("budget", budget), positive_int("depth", depth), positive_int("width", width),
                   positive_int("max_children", max_children))
    check_drafted("sparse", depth=depth, budget=budget)
    label = f"sparse {budget}/{depth} {verifier}"
    if getattr(chosen, "fixed_num_drafts", None) not in (None, 1):
        raise ValueError(f"verifier: {verifier!r} takes exactly {chosen.fixed_num_drafts} drafts; a budgeted tree "
                         "decides each node's count")
    if per_node:
        return Method(label, shape, (chosen,) * depth)
    return Method(label, shape, (), chosen)


def batch(num_drafts: int = 2, gamma: int = 3) -> Method:
    """[YIN] batch speculative decoding: M roots by RRS, then one chain of γ − 1."""
    check_drafted("batch", positive_int("num_drafts", num_drafts), gamma=positive_int("gamma", gamma))
    branching = (num_drafts,) + (1,) * (gamma - 1)
    verifiers = (get_verifier("rrs"),) + (get_verifier("single"),) * (gamma - 1)
    return Method(f"batch M={num_drafts} γ={gamma}", Levels(branching), verifiers)


def decoding_opt(gamma: int = 3, epsilon: float = 0.1) -> Method:
    """Chain with Decoding-OPT's b = min(1, (p + ε)/q) and residual norm((p − q)+)."""
    gamma, epsilon = positive_int("gamma", gamma), finite_number("epsilon", epsilon, 0.0)
    check_drafted("decoding_opt", gamma=gamma)
    return Method(f"decoding_opt γ={gamma} ε={epsilon:g}", Levels((1,) * gamma),
                  (get_verifier("decoding_opt", epsilon=epsilon),) * gamma)


def decoding_uno(gamma: int = 3, epsilon: float = 0.1) -> Method:
    """Chain with Decoding-UNO's b = min(1, (p + ε)/q), resampling from p."""
    gamma, epsilon = positive_int("gamma", gamma), finite_number("epsilon", epsilon, 0.0)
    check_drafted("decoding_uno", gamma=gamma)
    return Method(f"decoding_uno γ={gamma} ε={epsilon:g}", Levels((1,) * gamma),
                  (get_verifier("decoding_uno", epsilon=epsilon),) * gamma)


METHODS = {
    builder.__name__: builder
    for builder in [autoregressive, chain, tree, sparse, batch, decoding_opt, decoding_uno]
}


def method_options(name: str) -> list[str]:
    """The options the method ``name`` takes."""
    return list(inspect.signature(_builder(name)).parameters)


def build_method(name: str, **options) -> Method:
    """Build a method by name. Options set to None keep the method's default; an option the
    method does not take is an error naming it (a typo is never silently ignored)."""
    builder = _builder(name)
    taken = inspect.signature(builder).parameters
    unknown = sorted(set(options) - set(taken))
    if unknown:
        raise ValueError(f"{unknown[0]}: method {name!r} takes no option {unknown[0]!r}; it takes {sorted(taken) or 'none'}")
    return builder(**{key: value for key, value in options.items() if value is not None})


def _builder(name: str):
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        raise ValueError(f"method: unknown method {name!r}; choose one of {sorted(METHODS)}") from None
