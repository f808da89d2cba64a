"""A request's acceptance beside the best any verifier could reach with the same drafts.

At each verified node of the walk (a node with drafts, verified token by token) the verifier's
exact acceptance probability P(emitted token ∈ drafts | p, q) (``Verifier.acceptance_rate``:
for a chain's single draft, Σ min(p, q)) and α*, the optimum of its draft scheme for the same
p, q and number of drafts (``Verifier.optimum``, SPEC.md §4.2), are recorded; their means over
the verified positions and the gap α* − acceptance say how far this request's verification is
from the best possible. Whole-tree verifiers (block, traversal) are not recorded.

A ``Decoder``'s recorder is off (budget 0) until given a budget; the ``Speculator``'s decoders
(``specbound run``, ``serve``, ``generate``) get ``BUDGET``. Both figures cost a pass or a sort
over the vocabulary per node (more for many drafts; ``benchmarks/bench_audit.py --sections
optimum`` measures it against decoding), so ``OptimumRecorder`` computes them at a random
share of the positions (its own seeded generator: the tokens never change) chosen so that
their time stays within ``BUDGET`` of the decoding time between its calls; with a share below
1 the means carry a standard error (positions sampled at random from the request's verified
positions, finite-population corrected: 0 when every position was computed). Rows whose exact acceptance is
refused (its work limit, ``checks.WorkLimitError``, or any other ValueError) are left out:
the figures never stop decoding.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

BUDGET = 0.1  # the recorder's time at most this share of the decoding time between its calls
IDLE_GAP = 1.0  # seconds between two calls beyond which the gap counts as idle (a server waiting)


@dataclass
class OptimumTally:
    """One run's recorded positions (module docstring)."""

    acceptances: list[float] = field(default_factory=list)  # the verifier's exact acceptance, per computed position
    optima: list[float] = field(default_factory=list)  # α* at the same positions
    positions: int = 0  # verified positions seen, computed or not
    seconds: float = 0.0  # spent computing them

    def merge(self, other: OptimumTally) -> OptimumTally:
        return OptimumTally(self.acceptances + other.acceptances, self.optima + other.optima,
                            self.positions + other.positions, self.seconds + other.seconds)

    def summary(self) -> dict:
        """Means over the computed positions and their standard errors as estimates of the
        means over every verified position (None where nothing was computed)."""
        computed = len(self.acceptances)
        if not computed:
            return {"expected_acceptance": None, "optimal_acceptance": None, "acceptance_gap": None,
                    "positions": self.positions, "computed": 0, "seconds": self.seconds}
        gaps = np.array(self.optima) - np.array(self.acceptances)
        return {"expected_acceptance": float(np.mean(self.acceptances)),
                "optimal_acceptance": float(np.mean(self.optima)), "acceptance_gap": float(gaps.mean()),
                "standard_error": {"expected_acceptance": self._error(self.acceptances),
                                   "optimal_acceptance": self._error(self.optima), "acceptance_gap": self._error(gaps)},
                "positions": self.positions, "computed": computed, "seconds": self.seconds}

    def _error(self, values) -> float | None:
        """s/√m · √(1 − m/N): a sample of m of the N positions, drawn without replacement
        (None where a single value of several gives no estimate: the figures go into JSON)."""
        computed = len(values)
        if computed >= self.positions:
            return 0.0
        if computed < 2:
            return None
        return float(np.std(values, ddof=1) / math.sqrt(computed) * math.sqrt(1 - computed / self.positions))


class OptimumRecorder:
    """Decides, position by position, whether to compute the acceptance and α* (module
    docstring), and records them in a run's ``OptimumTally``."""

    def __init__(self, budget: float = BUDGET, seed: int = 0):
        self.budget = budget
        self.rng = np.random.default_rng(seed)
        self.decoding_seconds = 0.0  # between calls, idle gaps left out
        self.computing_seconds = 0.0
        self.positions = 0  # seen
        self.computed = 0
        self.last = None  # when the last call returned

    @property
    def rate(self) -> float:
        """The share of positions to compute: 1 until a cost is known, then as much as the
        budget allows: budget × (decoding seconds per position) / (seconds per computation);
        0 with a budget of 0 (nothing recorded)."""
        if self.budget <= 0:
            return 0.0
        if not self.computed or self.computing_seconds <= 0:
            return 1.0
        per_position = self.decoding_seconds / self.positions
        return min(1.0, self.budget * per_position / (self.computing_seconds / self.computed))

    def record(self, tally: OptimumTally, verifier, target_probs, draft_probs, num_drafts: int) -> None:
        """One verified position: maybe compute its acceptance and α*.  # [1, vocab] x2"""
        now = time.perf_counter()
        if self.last is not None and now - self.last < IDLE_GAP:
            self.decoding_seconds += now - self.last
        tally.positions += 1
        self.positions += 1
        if self.rng.random() < self.rate:
            try:
                acceptance = float(np.asarray(verifier.acceptance_rate(target_probs, draft_probs, num_drafts))[0])
                best = float(np.asarray(verifier.optimum(target_probs, draft_probs, num_drafts))[0])
            except ValueError:  # WorkLimitError among them: a figure never stops decoding
                pass
            else:
                tally.acceptances.append(acceptance)
                tally.optima.append(best)
            spent = time.perf_counter() - now
            tally.seconds += spent
            self.computing_seconds += spent
            self.computed += 1
        self.last = time.perf_counter()
