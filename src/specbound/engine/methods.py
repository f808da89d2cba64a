"""Decoding methods: the shape of each step's draft tree and the verifier at each depth.

One engine runs them all (``specbound.engine.decode``); a method only says, for depth
k = 0, 1, ..., d − 1, how many drafts each node gets, from which draft scheme, and which
verifier of the registry (``specbound.verifiers``) decides there:

| method           | drafts per depth          | verifier per depth                 | source        |
|------------------|---------------------------|------------------------------------|---------------|
| autoregressive   | (none: d = 0)             | (a token from p each step)         |               |
| chain            | 1, 1, ..., 1 (γ)          | single (speculative sampling)      | [LEV] §1      |
| tree             | n, n, ..., n (d)          | any multi-draft verifier           | [HU] §6       |
| batch            | M, 1, ..., 1 (γ)          | rrs at the root, then single       | [YIN] §2      |
| decoding_opt/uno | 1, 1, ..., 1 (γ)          | decoding_opt / decoding_uno with ε | [YIN] §3      |

Batch SD [YIN Alg. 4]: M independent draft continuations; the M root tokens are tried
in turn by recursive rejection (RRS with replacement), and once one is accepted only its
continuation is verified, by plain speculative sampling. Drafting the M roots i.i.d. and
one chain below each distinct root is that algorithm: continuations below equal roots
are i.i.d., so sharing one changes no law.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from specbound.engine.drafters import DraftLevel
from specbound.checks import positive_int
from specbound.verifiers import Verifier, get_verifier


@dataclass(frozen=True)
class Method:
    name: str
    branching: tuple[int, ...]  # drafts per node at depth 0, 1, ..., d - 1
    verifiers: tuple[Verifier, ...]  # the verifier deciding at each depth

    def __post_init__(self):
        if len(self.branching) != len(self.verifiers):
            raise ValueError(
                f"verifiers: one per depth expected ({len(self.branching)}), got {len(self.verifiers)}"
            )
        for depth, (num_drafts, verifier) in enumerate(zip(self.branching, self.verifiers)):
            verifier.check_num_drafts(num_drafts)
            if num_drafts < 1:
                raise ValueError(f"branching: depth {depth} has {num_drafts} drafts per node")

    @property
    def depth(self) -> int:
        return len(self.branching)

    @property
    def lossless(self) -> bool:
        return all(verifier.lossless for verifier in self.verifiers)

    def levels(self, depth: int) -> list[DraftLevel]:
        """The draft levels of a tree cut to ``depth`` (near the token limit)."""
        return [
            DraftLevel(num_drafts, verifier.scheme)
            for num_drafts, verifier in zip(self.branching[:depth], self.verifiers[:depth])
        ]

    def verifier_at(self, depth: int, num_drafts: int) -> Verifier:
        """The verifier for a node at ``depth`` that got ``num_drafts`` drafts
        (``Verifier.for_num_drafts``)."""
        return self.verifiers[depth].for_num_drafts(num_drafts)


def autoregressive() -> Method:
    """One target call per token, sampled from p."""
    return Method("autoregressive", (), ())


def _chain(label: str, gamma: int, verifier: Verifier) -> Method:
    gamma = positive_int("gamma", gamma)
    return Method(label, (1,) * gamma, (verifier,) * gamma)


def chain(gamma: int = 3) -> Method:
    """Single draft, lookahead γ, bonus token when all γ are accepted (SPEC.md §6)."""
    return _chain(f"chain γ={gamma}", gamma, get_verifier("single"))


def tree(num_drafts: int = 2, depth: int = 2, verifier: str = "rrs_without_replacement") -> Method:
    """``num_drafts`` children per node from the verifier's draft scheme, ``depth`` levels."""
    chosen = get_verifier(verifier)
    branching = (positive_int("num_drafts", num_drafts),) * positive_int("depth", depth)
    return Method(f"tree {num_drafts}×{depth} {verifier}", branching, (chosen,) * depth)


def batch(num_drafts: int = 2, gamma: int = 3) -> Method:
    """[YIN] batch speculative decoding: M roots by RRS, then one chain of γ − 1."""
    branching = (positive_int("num_drafts", num_drafts),) + (1,) * (positive_int("gamma", gamma) - 1)
    verifiers = (get_verifier("rrs"),) + (get_verifier("single"),) * (gamma - 1)
    return Method(f"batch M={num_drafts} γ={gamma}", branching, verifiers)


def decoding_opt(gamma: int = 3, epsilon: float = 0.1) -> Method:
    """Chain with Decoding-OPT's b = min(1, (p + ε)/q) and residual norm((p − q)+)."""
    return _chain(f"decoding_opt γ={gamma} ε={epsilon:g}", gamma,
                  get_verifier("decoding_opt", epsilon=epsilon))


def decoding_uno(gamma: int = 3, epsilon: float = 0.1) -> Method:
    """Chain with Decoding-UNO's b = min(1, (p + ε)/q), resampling from p."""
    return _chain(f"decoding_uno γ={gamma} ε={epsilon:g}", gamma,
                  get_verifier("decoding_uno", epsilon=epsilon))


METHODS = {
    builder.__name__: builder
    for builder in [autoregressive, chain, tree, batch, decoding_opt, decoding_uno]
}


def build_method(name: str, **options) -> Method:
    """Build a method by name; ``options`` it does not take (e.g. ``depth`` for a chain)
    are ignored, options set to None keep the method's default."""
    try:
        builder = METHODS[name]
    except KeyError:
        raise ValueError(f"method: unknown method {name!r}; choose one of {sorted(METHODS)}") from None
    taken = inspect.signature(builder).parameters
    return builder(**{key: value for key, value in options.items() if key in taken and value is not None})
