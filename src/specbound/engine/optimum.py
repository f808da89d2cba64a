"""A request's acceptance beside the best any verifier could reach with the same drafts.

At each verified node of the walk (a node with drafts, verified token by token) the verifier's
exact acceptance probability P(emitted token ∈ drafts | p, q) (``Verifier.acceptance_rate``:
for a chain's single draft, Σ min(p, q)) and α*, the optimum of its draft scheme for the same
p, q and number of drafts (``Verifier.optimum``, SPEC.md §4.2), are recorded; their means over
the verified positions and the gap α* − acceptance say how far this request's verification is
from the best possible. α* ≥ acceptance holds exactly; where rounding puts a computed α*
below the acceptance (by about 1e-15), the summary raises it to the acceptance, so the gap
is never negative. Beside them, the target's mass on the tokens the drafter may propose
bounds both: p(S) for a draft restricted to the tokens S it shares with the target
(``engine.vocabulary``: acceptance ≤ α* ≤ p(S)), 1 for any other drafter. Whole-tree
verifiers (block, traversal) are not recorded.

A ``Decoder``'s recorder is off (budget 0) until given a budget; the ``Speculator``'s decoders
(``specbound run``, ``serve``, ``generate``) get ``BUDGET`` (``engine.assembly.assemble``).
Both figures cost a pass or a sort over the vocabulary per node (more for many drafts;
``benchmarks/audit/bench_audit.py --sections optimum`` measures it against decoding), so
``OptimumRecorder`` computes them where its budget allows:

- **decoding time** is the time between consecutive verified positions while a request is
  in progress (a request is its tally: the clock starts at its first verified position), slow
  steps included; the time before a request's first position (its prefill, a server waiting
  between requests) is not counted;
- **cost**: a verifier's first computation compiles its loops (numba; kept on disk, once per
  cache), so ``warm_up`` computes each (verifier, number of drafts) once on a two-token row
  before decoding (``assemble`` does, for every method its schedule may run; ``record`` does
  it for one met first), untimed by the tally and left out of the cost estimate: the mean
  seconds of the computations made since;
- **the share computed**: the first verified position of every request, so every request
  has figures, and each later one independently with probability
  min(1, budget × decoding seconds per position / seconds per computation) — none while the
  computing time already exceeds the budget's share of the decoding time.

The means are inverse-probability weighted (Hájek: each computed position weighs 1/π, π the
chance it had to be computed), estimates of the means over every verified position, with
their standard errors under that independent (Poisson) sampling: 0 when every position was
computed. Rows whose exact acceptance is refused (its work limit, ``checks.WorkLimitError``,
or any other ValueError) are left out: the figures never stop decoding.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

BUDGET = 0.1  # the recorder's time at most this share of the decoding time (module docstring)


@dataclass
class OptimumTally:
    """One run's recorded positions (module docstring)."""

    acceptances: list[float] = field(default_factory=list)  # the verifier's exact acceptance, per computed position
    optima: list[float] = field(default_factory=list)  # α* at the same positions
    weights: list[float] = field(default_factory=list)  # 1/π: π the chance the position had to be computed
    bounds: list[float] = field(default_factory=list)  # p(tokens the drafter may propose) there: 1, or p(S) for a
    # draft with another tokenizer (engine.vocabulary), which bounds both figures
    positions: int = 0  # verified positions seen, computed or not
    seconds: float = 0.0  # spent computing them

    def merge(self, other: OptimumTally) -> OptimumTally:
        return OptimumTally(self.acceptances + other.acceptances, self.optima + other.optima,
                            self.weights + other.weights, self.bounds + other.bounds, self.positions + other.positions,
                            self.seconds + other.seconds)

    def summary(self) -> dict:
        """Weighted means over the computed positions and their standard errors, as
        estimates of the means over every verified position; α* raised to the acceptance
        where rounding put it below, so ``acceptance_gap`` ≥ 0 (None where nothing was
        computed)."""
        computed = len(self.acceptances)
        if not computed:
            return {"expected_acceptance": None, "optimal_acceptance": None, "acceptance_gap": None,
                    "shared_mass": None, "positions": self.positions, "computed": 0, "seconds": self.seconds}
        acceptances = np.array(self.acceptances)
        optima = np.maximum(np.array(self.optima), acceptances)
        gaps = optima - acceptances  # ≥ 0: a float subtraction of a smaller number
        weights = np.array(self.weights)
        bounds = np.array(self.bounds)
        return {"expected_acceptance": self._mean(acceptances, weights),
                "optimal_acceptance": self._mean(optima, weights), "acceptance_gap": self._mean(gaps, weights),
                "shared_mass": self._mean(bounds, weights),
                "standard_error": {"expected_acceptance": self._error(acceptances, weights),
                                   "optimal_acceptance": self._error(optima, weights),
                                   "acceptance_gap": self._error(gaps, weights),
                                   "shared_mass": self._error(bounds, weights)},
                "positions": self.positions, "computed": computed, "seconds": self.seconds}

    @staticmethod
    def _mean(values, weights) -> float:
        """Σ w·x / Σ w, kept within the values' range (rounding could step past it)."""
        return float(np.clip(np.dot(weights, values) / weights.sum(), values.min(), values.max()))

    @staticmethod
    def _error(values, weights) -> float | None:
        """√(Σ (1 − π)/π² · (x − mean)²) / Σ 1/π, the weighted mean's standard error under
        independent sampling with probabilities π (0 where every π is 1; None where a single
        sampled value gives no estimate: the figures go into JSON)."""
        if np.all(weights == 1.0):
            return 0.0
        if len(values) < 2:
            return None
        residuals = values - np.dot(weights, values) / weights.sum()
        return float(math.sqrt(np.dot(weights * weights - weights, residuals**2)) / weights.sum())


class OptimumRecorder:
    """Decides, position by position, whether to compute the acceptance and α* (module
    docstring), and records them in a request's ``OptimumTally``."""

    def __init__(self, budget: float = BUDGET, seed: int = 0):
        self.budget = budget
        self.rng = np.random.default_rng(seed)
        self.decoding_seconds = 0.0  # between consecutive verified positions of requests in progress
        self.timed_positions = 0  # positions whose decoding time since the last one is counted
        self.computing_seconds = 0.0  # warm-ups left out
        self.computed = 0
        self.warmed: set[tuple[type, int]] = set()  # (verifier class, number of drafts) computed once already
        self.warm_up_seconds = 0.0
        self.last = None  # when the last call returned

    @property
    def rate(self) -> float:
        """The chance of computing a position that is not its request's first (module
        docstring): 1 until a cost and a decoding time are known; 0 with a budget of 0."""
        if self.budget <= 0:
            return 0.0
        if not self.computed or not self.timed_positions or self.computing_seconds <= 0:
            return 1.0
        if self.computing_seconds > self.budget * self.decoding_seconds:
            return 0.0
        per_position = self.decoding_seconds / self.timed_positions
        return min(1.0, self.budget * per_position / (self.computing_seconds / self.computed))

    def warm_up(self, verifiers) -> None:
        """Compute each (verifier, number of drafts) of ``verifiers`` not met yet once on a
        two-token row (more for as many drafts), untimed by the tallies and the estimate
        (module docstring). Nothing with a budget of 0."""
        if self.budget <= 0:
            return
        for verifier, num_drafts in verifiers:
            key = (type(verifier), num_drafts)
            if key in self.warmed:
                continue
            self.warmed.add(key)
            started = time.perf_counter()
            size = num_drafts + 1
            target_probs = np.full((1, size), 1 / size)  # [1, size]
            draft_probs = np.linspace(1, 2, size)[None] / np.linspace(1, 2, size).sum()  # [1, size]
            try:
                verifier.acceptance_rate(target_probs, draft_probs, num_drafts)
                verifier.optimum(target_probs, draft_probs, num_drafts)
            except ValueError:  # a scheme this small a row cannot hold: its first real row compiles it
                pass
            self.warm_up_seconds += time.perf_counter() - started

    def record(self, tally: OptimumTally, verifier, target_probs, draft_probs, num_drafts: int,
               shared=None) -> None:
        """One verified position of the request ``tally`` records: maybe compute its
        acceptance, α* and the bound p(``shared``), the target's mass on the tokens the
        drafter may propose (1 where ``shared`` is None: every token).
        # [1, vocab] x2, shared [vocab] bool"""
        now = time.perf_counter()
        first = tally.positions == 0
        if not first and self.last is not None:  # the request was decoding all along since the last call
            self.decoding_seconds += now - self.last
            self.timed_positions += 1
        tally.positions += 1
        if self.budget <= 0:
            self.last = time.perf_counter()
            return
        chance = 1.0 if first else self.rate
        if chance > 0 and (chance >= 1 or self.rng.random() < chance):
            self.warm_up([(verifier, num_drafts)])
            started = time.perf_counter()
            try:
                acceptance = float(np.asarray(verifier.acceptance_rate(target_probs, draft_probs, num_drafts))[0])
                best = float(np.asarray(verifier.optimum(target_probs, draft_probs, num_drafts))[0])
            except ValueError:  # WorkLimitError among them: a figure never stops decoding
                pass
            else:
                tally.acceptances.append(acceptance)
                tally.optima.append(best)
                tally.weights.append(1 / chance)
                tally.bounds.append(1.0 if shared is None else
                                    float(target_probs[0][shared.to(target_probs.device)].sum(dtype=torch.float64)))
            spent = time.perf_counter() - started
            tally.seconds += spent
            self.computing_seconds += spent
            self.computed += 1
        self.last = time.perf_counter()
