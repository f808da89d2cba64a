"""The engine's limit on the drafted tokens one target call verifies, checked without torch,
numba or scipy: ``methods`` builds no method beyond it, and the command line refuses a size
beyond it while it parses the options (``studies.options``), before anything heavy loads."""

from __future__ import annotations

from specbound.checks import within_limit

MAX_DRAFTED_PER_CALL = 4096  # tokens one target call verifies, each with a vocabulary row (0.6 MB at 151,936)


def check_drafted(method: str, num_drafts: int | None = None, depth: int | None = None,
                  gamma: int | None = None, budget: int | None = None) -> None:
    """Refuse (``checks.WorkLimitError``) a method whose one target call would verify more
    than ``MAX_DRAFTED_PER_CALL`` drafted tokens — a full tree's Σ_{k ≤ depth} n^k, n chains
    of γ, a budget of nodes — before anything of that size is built (the sizes it does not
    have are None; each is a positive int)."""
    width = num_drafts or 1
    if budget is not None:
        drafted = budget
    elif depth is not None:
        drafted, level = 0, 1
        for _ in range(depth if width > 1 else 0):
            level *= width
            drafted += level
            if drafted > MAX_DRAFTED_PER_CALL:  # counted no further: the answer is no
                break
        drafted = drafted or depth
    else:
        drafted = width * (gamma or 1)
    sizes = {"num_drafts": num_drafts, "depth": depth, "gamma": gamma, "budget": budget}
    shown = ", ".join(f"{name} = {value:,}" for name, value in sizes.items() if value is not None)
    within_limit(f"{method} ({shown})", drafted, MAX_DRAFTED_PER_CALL, "drafted tokens",
                 hint="a smaller tree or lookahead (each drafted token is verified with a vocabulary row)")
