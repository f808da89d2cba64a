"""The planner behind ``--method auto``: choose the method that maximises predicted tokens/s
on this machine, and re-plan as acceptance drifts.

Predicted tokens/s of a candidate = (1 + E[accepted drafts per step]) / E[seconds per step].

**Seconds** come from measured forward costs (``engine.costs``): the target's cost of its
rows (the pending token plus the tree), and per draft forward the cheapest draft variant
for its rows (as loaded, int8, int4: ``engine.precisions.PRECISIONS``; the drafter runs that
variant). Time outside the models (masks, sampling, verification) is kept small by the
engine and left out, so that the plans — hence the tokens — depend only on the measured
costs and on the steps run: with the same cost book and seed, ``auto`` draws the same
tokens every time.

**Acceptance** comes from the steps already run. Every verification records its depth, the
number of drafts at the node and whether it descended (``RunStats``); the planner pools
them into a(d, k) = P(descend | a node at depth d with k drafts) — for k = 1 from the exact
single-draft acceptance Σ min(p, q) of every node verified at depth d, which a budgeted
tree's choice of which nodes get one child does not bias (``Planner.acceptance``). A chain of γ accepts
E = Σ_{k≤γ} Π_{d<k} a(d, 1); a tree is predicted the same way along its accepted path with
the children its shape gives a path node (for a budgeted tree, the children its path nodes
had in the steps run: ``Planner._path_mix``); a candidate that has run long enough is predicted
from its own mean accepted length. Before anything ran, a(d, k) = 1 − (1 − a₀)·ρ^{k−1}
with the prior single-draft acceptance a₀ and ρ the share of the rejected mass a further
draft recovers. The plans made before any verification was seen are optimistic (a₀ =
``OPTIMISTIC_ACCEPTANCE``): where even that cannot beat plain decoding by ``MIN_GAIN`` — a CPU
on which a forward costs time linear in its rows — autoregressive decoding is chosen and
nothing is drafted at all (the draft model is not even prefilled), so ``auto`` is never
slower than it by more than its bookkeeping. A planner
kept across generations (as a server keeps it) plans the next one from what it has seen,
not from the optimistic prior again.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

from specbound.engine.costs import Costs
from specbound.engine.methods import Budget, Levels, Method, build_method

OPTIMISTIC_ACCEPTANCE = 0.9
PRIOR_ACCEPTANCE = 0.8
RECOVERED_SHARE = 0.5  # ρ: share of the rejected mass each further draft at a node recovers (prior)
REPLAN_EVERY = 8  # steps between plans
PLAN_HISTORY = 4096  # plans kept for ``describe`` and ``summary``, the latest
# A drafting plan must be predicted this much faster than plain decoding to be chosen: the
# prediction leaves out the time outside the models and rests on costs measured once, so a
# plan predicted a few percent faster can run slower (benchmarks/README.md, llama.cpp backend).
MIN_GAIN = 1.1
OWN_STEPS = 16  # steps after which a candidate is predicted from its own accepted lengths
PSEUDO_COUNT = 8.0  # weight of the prior in a(d, k), in verifications


@dataclass(frozen=True)
class Candidate:
    """A method the planner may choose: a name of ``engine.methods``, its options, and who
    drafts it ("model": the draft model; "lookup": prompt lookup and "suffix": suffix
    decoding, whose drafts cost no forward)."""

    method: str
    options: tuple = ()
    drafter: str = "model"

    def build(self) -> Method:
        method = build_method(self.method, **dict(self.options))
        if self.drafter == "model":
            return method
        return dataclasses.replace(method, name=f"{self.drafter} {method.name}", drafter=self.drafter)

    @property
    def label(self) -> str:
        return self.build().name


def default_candidates(max_depth: int = 8, lookup: bool = False, suffix: bool = False) -> list[Candidate]:
    """Autoregressive, chains γ = 1..``max_depth``, and budgeted sparse trees; with
    ``lookup`` also prompt-lookup chains γ = 1..``max_depth``; with ``suffix`` also suffix
    decoding's chains and its trees of 8, 16 and 32 nodes (``engine.suffix``)."""
    candidates = [Candidate("autoregressive")]
    if lookup:
        candidates += [Candidate("chain", (("gamma", gamma),), "lookup") for gamma in range(1, max_depth + 1)]
    if suffix:
        candidates += [Candidate("chain", (("gamma", gamma),), "suffix") for gamma in range(1, max_depth + 1)]
        candidates += [Candidate("sparse", (("budget", budget), ("depth", max_depth), ("width", width),
                                            ("max_children", 3)), "suffix")
                       for budget, width in ((8, 2), (16, 3), (32, 4))]
    candidates += [Candidate("chain", (("gamma", gamma),)) for gamma in range(1, max_depth + 1)]
    for budget, depth, width in ((6, 4, 2), (8, 5, 2), (10, 6, 2), (12, 6, 3), (16, 6, 3), (16, 8, 2),
                                 (24, 8, 3), (32, 8, 4)):
        if depth <= max_depth:
            candidates.append(Candidate("sparse", (("budget", budget), ("depth", depth), ("width", width),
                                                   ("max_children", 3))))
    return candidates


@dataclass(frozen=True)
class Prediction:
    candidate: Candidate
    accepted: float  # E[accepted drafts per step]
    seconds: float  # E[seconds per step]

    @property
    def tokens_per_second(self) -> float:
        return (1.0 + self.accepted) / self.seconds


@dataclass
class Evidence:
    """What the verified steps of one drafter showed: per (depth, drafts at the node) the
    verifications and the descents, and per depth the sum of the exact single-draft
    acceptances Σ min(p, q) of the nodes verified there, with their count."""

    attempts: dict = field(default_factory=dict)  # (depth, drafts) -> verifications
    accepts: dict = field(default_factory=dict)  # (depth, drafts) -> descents
    overlaps: dict = field(default_factory=dict)  # depth -> (Σ of Σ min(p, q), nodes)

    def record(self, depth: int, drafts: int, descended: bool, overlap: float | None = None, count: int = 1) -> None:
        """``count`` verifications at a node of ``depth`` with ``drafts`` drafts, each
        descending or not, with single-draft acceptance ``overlap`` (None: not known)."""
        key = (depth, drafts)
        self.attempts[key] = self.attempts.get(key, 0) + count
        self.accepts[key] = self.accepts.get(key, 0) + count * int(descended)
        if overlap is not None:
            total, seen = self.overlaps.get(depth, (0.0, 0))
            self.overlaps[depth] = (total + count * overlap, seen + count)


@dataclass
class Planner:
    """Chooses among ``candidates`` by predicted tokens/s (module docstring).

    ``target_costs``: the target's forward cost by rows; ``draft_costs``: per draft precision
    (``engine.precisions.PRECISIONS``: the variant names of ``CausalLM``) its cost by rows;
    empty without a draft model, which leaves the candidates that need none
    (autoregressive, prompt lookup). ``evidence``: per drafter, what its verified steps
    showed (``observe`` adds to it)."""

    target_costs: Costs
    draft_costs: dict[str, Costs] = field(default_factory=dict)
    candidates: list[Candidate] = field(default_factory=default_candidates)
    prior_acceptance: float = PRIOR_ACCEPTANCE
    replan_every: int = REPLAN_EVERY
    name: str = "auto"
    adaptive = True  # its methods follow what it learns (``methods.Schedule``)
    evidence: dict[str, Evidence] = field(default_factory=dict)
    _own: dict = field(default_factory=dict)  # candidate -> [steps, accepted drafts, drafted nodes]
    _path_children: dict = field(default_factory=dict)  # budgeted candidate -> depth -> {children: path nodes}
    current: Candidate | None = None
    history: list = field(default_factory=list)  # (step, candidate label, predicted tokens/s), the latest
    # PLAN_HISTORY plans: a server's planner plans for as long as it runs
    _optimistic_plans: list = field(default_factory=list)  # per history entry: made on the optimistic prior
    plans_made: int = 0  # plans made in all, the ones no longer in ``history`` too

    def __post_init__(self):
        if not self.draft_costs:
            self.candidates = [candidate for candidate in self.candidates
                               if candidate.method == "autoregressive" or candidate.drafter != "model"]
        self._methods = {candidate: candidate.build() for candidate in self.candidates}

    # -- what the decoder calls ----------------------------------------------------------------
    @property
    def depth(self) -> int:
        """The deepest tree any candidate drafts (the decoder prepares a drafter if > 0)."""
        return max(method.depth for method in self._methods.values())

    @property
    def max_nodes(self) -> int:
        """The largest tree any candidate drafts."""
        return max(method.max_nodes for method in self._methods.values())

    def method_for(self, step: int) -> Method:
        """The method of step ``step`` (0, 1, ...): re-planned every ``replan_every`` steps,
        optimistically only while no verification has been seen (a planner kept across
        generations, as a server keeps it, starts the next one from what it learnt)."""
        if self.current is None or step % self.replan_every == 0:
            optimistic = not any(evidence.attempts for evidence in self.evidence.values())
            best = self.best()
            self.current = best.candidate
            self.history.append((step, best.candidate.label, best.tokens_per_second))
            self._optimistic_plans.append(optimistic)
            self.plans_made += 1
            if len(self.history) > PLAN_HISTORY:
                del self.history[0], self._optimistic_plans[0]
        return self._methods[self.current]

    def observe(self, method: Method, tree, accepted_path: list[int], target_rows=None) -> None:
        """Learn from one verified step of ``method``: which nodes were verified, how many
        drafts each had, where it descended; with ``target_rows`` (the target's row at each
        visited node, root first: ``StepOutcome.target_probs``) also each visited node's
        exact single-draft acceptance Σ min(p, q)."""
        candidate = next(c for c, m in self._methods.items() if m is method)
        own = self._own.setdefault(candidate, [0, 0, 0])
        own[0] += 1
        own[1] += len(accepted_path)
        own[2] += len(tree) - 1
        visited = [0] + accepted_path
        evidence = self.evidence.setdefault(method.drafter, Evidence())
        if len(tree) == 1 and method.drafter != "model":  # a drafter with nothing to propose: nothing accepted
            evidence.record(0, 1, False, 0.0)
        budgeted = isinstance(method.shape, Budget)
        for position, node in enumerate(visited):
            depth = tree.depths[node]
            if budgeted and depth < method.depth:  # children of the path node at this depth (0: the tree ended)
                counts = self._path_children.setdefault(candidate, {}).setdefault(depth, {})
                children = len(tree.children[node])
                counts[children] = counts.get(children, 0) + 1
            if node not in tree.draft_tokens:
                break
            overlap = None
            if target_rows is not None and position < len(target_rows):
                overlap = float(torch.minimum(target_rows[position].reshape(-1), tree.draft_probs[node]).sum())
            evidence.record(depth, len(tree.children[node]), position + 1 < len(visited), overlap)

    # -- predictions ---------------------------------------------------------------------------
    def best(self, optimistic: bool | None = None) -> Prediction:
        """The candidate of the highest predicted tokens/s, each predicted optimistically
        while its drafter has shown nothing yet (so a drafter not tried yet gets tried), or
        as ``optimistic`` says for all."""
        predictions = [self.predict(candidate, not self._seen(candidate.drafter) if optimistic is None else optimistic)
                       for candidate in self.candidates]
        best = max(predictions, key=lambda prediction: prediction.tokens_per_second)
        plain = next((prediction for prediction in predictions if prediction.candidate.method == "autoregressive"), None)
        if plain is not None and best.tokens_per_second < MIN_GAIN * plain.tokens_per_second:
            return plain  # not enough faster to be worth the prediction's error (MIN_GAIN)
        return best

    def predict(self, candidate: Candidate, optimistic: bool = False) -> Prediction:
        method = self._methods[candidate]
        return Prediction(candidate, self._accepted(candidate, method, optimistic), self._seconds(candidate, method))

    def _seen(self, drafter: str) -> bool:
        return bool(self.evidence.get(drafter, Evidence()).attempts)

    def acceptance(self, depth: int, drafts: int, optimistic: bool = False, drafter: str = "model") -> float:
        """a(d, k): P(descend | a node at depth d with k drafts): the verifications seen at
        (d, k), shrunk toward the prior 1 − (1 − a₀)·ρ^{k−1}, where a₀ is the single-draft
        acceptance pooled over every depth seen (``prior_acceptance`` before any). The
        optimistic value never falls below the optimistic prior.

        For k = 1 the planner uses, where it has them, the exact single-draft acceptances
        Σ min(p, q) of every node verified at depth d, whatever its number of drafts: the
        descents of one-draft nodes alone are biased upward by a budgeted tree, which gives
        one child to the nodes its draft is confident at, so they would over-predict deep
        chains.

        Each drafter has its own evidence (``drafter``): prompt lookup's drafts are accepted
        at rates that say nothing of the draft model's."""
        evidence = self.evidence.get(drafter, Evidence())
        if evidence.overlaps:
            single_hits = sum(total for total, _ in evidence.overlaps.values())
            single_seen = sum(count for _, count in evidence.overlaps.values())
        else:
            single_seen = sum(count for (_, k), count in evidence.attempts.items() if k == 1)
            single_hits = sum(count for (_, k), count in evidence.accepts.items() if k == 1)
        single = (single_hits + PSEUDO_COUNT * self.prior_acceptance) / (single_seen + PSEUDO_COUNT)
        if optimistic:
            single = max(single, OPTIMISTIC_ACCEPTANCE)
        prior = 1.0 - (1.0 - single) * RECOVERED_SHARE ** (drafts - 1)
        if drafts == 1 and evidence.overlaps:
            # Each depth shrunk toward the one above it, not toward the all-depth mean: a plan
            # of γ yields nothing below depth γ, and the mean, which the first and hardest
            # depth dominates, would under-predict every deeper chain, so none would be tried.
            observed = prior
            for shallower in range(depth + 1):
                hits, seen = evidence.overlaps.get(shallower, (0.0, 0))
                observed = (hits + PSEUDO_COUNT * observed) / (seen + PSEUDO_COUNT)
        else:
            hits, seen = evidence.accepts.get((depth, drafts), 0), evidence.attempts.get((depth, drafts), 0)
            observed = (hits + PSEUDO_COUNT * prior) / (seen + PSEUDO_COUNT)
        return max(prior, observed) if optimistic else observed

    def _accepted(self, candidate: Candidate, method: Method, optimistic: bool) -> float:
        own = self._own.get(candidate)
        if own and own[0] >= OWN_STEPS and not optimistic:
            return own[1] / own[0]
        expected, reach = 0.0, 1.0
        for depth, drafts in enumerate(_path_drafts(method.shape)):
            mix = self._path_mix(candidate, depth) if not optimistic else None
            if mix is None:
                reach *= self.acceptance(depth, drafts, optimistic, method.drafter)
            else:
                reach *= sum(share * (self.acceptance(depth, k, drafter=method.drafter) if k else 0.0)
                             for k, share in mix.items())
            expected += reach
        return expected

    def _path_mix(self, candidate: Candidate, depth: int) -> dict[int, float] | None:
        """How many children the accepted path's node at ``depth`` had in a budgeted tree's
        steps ({children: share}; 0 where the tree ended there): the candidate's own steps,
        else every budgeted candidate's pooled, else None (the shape's most). A budget
        spreads its nodes over the tree, so a path node seldom has the most children a node
        may get — predicting as if it had would overstate budgeted trees."""
        counts = self._path_children.get(candidate, {}).get(depth)
        if not counts:
            counts = {}
            for other in self._path_children.values():
                for children, count in other.get(depth, {}).items():
                    counts[children] = counts.get(children, 0) + count
        total = sum(counts.values())
        return {children: count / total for children, count in counts.items()} if total else None

    def _seconds(self, candidate: Candidate, method: Method) -> float:
        nodes = self._nodes(candidate, method)
        seconds = self.target_costs(1 + nodes)
        if method.depth and method.drafter == "model":  # prompt lookup runs no forward
            levels = _level_rows(method.shape, nodes)
            seconds += self.draft_seconds(2) + sum(self.draft_seconds(rows) for rows in levels[:-1])
        return seconds

    def _nodes(self, candidate: Candidate, method: Method) -> float:
        own = self._own.get(candidate)
        if own and own[0]:
            return own[2] / own[0]
        return float(method.shape.max_nodes)

    def draft_seconds(self, rows: float) -> float:
        """The cheapest draft variant's seconds for a forward of ``rows`` rows."""
        return min(costs(max(1, math.ceil(rows))) for costs in self.draft_costs.values())

    def variant_for_rows(self, rows: int) -> str:
        """The draft variant measured fastest for ``rows`` rows (the drafter's rule)."""
        return min(self.draft_costs, key=lambda variant: self.draft_costs[variant](max(1, rows)))

    def summary(self) -> tuple[str, float | None]:
        """(the plans chosen, each with its share of the plans made; the mean tokens/s they
        predicted), the optimistic plans left out where there are others."""
        history = [entry for entry, optimistic in zip(self.history, self._optimistic_plans)
                   if not optimistic] or self.history
        if not history:
            return "", None
        shares: dict[str, int] = {}
        for _, label, _ in history:
            shares[label] = shares.get(label, 0) + 1
        plans = ", ".join(f"{label} {count / len(history):.0%}"
                          for label, count in sorted(shares.items(), key=lambda item: -item[1]))
        return plans, sum(speed for _, _, speed in history) / len(history)

    def describe(self, since: int = 0) -> str:
        """The plans chosen after the first ``since`` (those of one generation: ``since`` =
        ``plans_made`` before it), with their predicted tokens/s; at most the latest
        ``PLAN_HISTORY``."""
        kept = self.history[max(0, since - (self.plans_made - len(self.history))):]
        return "; ".join(f"step {step}: {label} ({speed:.2f} tok/s predicted)" for step, label, speed in kept)


def _path_drafts(shape) -> list[int]:
    """Drafts at each node of the accepted path, depth by depth, as the shape gives them."""
    if isinstance(shape, Levels):
        return list(shape.branching)
    assert isinstance(shape, Budget)
    drafts, left = [], shape.nodes
    for _ in range(shape.max_depth):
        if left <= 0:
            break
        children = min(shape.max_children, shape.width, left)
        drafts.append(children)
        left -= min(shape.width, left)
    return drafts


def _level_rows(shape, nodes: float) -> list[float]:
    """Drafted nodes at each depth (the last depth is never scored by the draft)."""
    if isinstance(shape, Levels):
        rows, width = [], 1
        for count in shape.branching:
            width *= count
            rows.append(float(width))
        return rows
    levels, left = [], nodes
    while left > 0 and len(levels) < shape.max_depth:
        levels.append(min(float(shape.width), left))
        left -= shape.width
    return levels or [0.0]
