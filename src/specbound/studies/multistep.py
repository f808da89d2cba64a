"""Multi-step verification along real generations (SPEC.md §7): token-wise, block and
traversal verification on the same drafted steps, and the multi-step optimum.

Units: prompts × temperatures × configurations — chains of γ drafts (``gammas``), trees of
n drafts per node over d levels (``trees``, "n×d") and budgeted sparse trees (``sparse``,
"budget/depth", ``engine.methods.sparse``). Each unit decodes its prompt with the engine.
The drafts of a step are drawn once, with the scheme every verifier compared needs: one
draw per node on a chain, without replacement on a tree (traversal's setting; token-wise
RRS without replacement verifies the same trees). At every step that drafted, the Decoder's
observer hands over the drafted tree and the target rows of its nodes, and the exact
expected number of accepted drafts given that tree, E[τ | tree] (SPEC.md §7.3), is recorded
for every verifier that applies:
- token-wise: ``single`` on chains, ``rrs_without_replacement`` on trees (SPEC.md §6);
- ``block`` on chains (§7.1);
- ``traversal`` everywhere (§7.2; on a chain it *is* block verification);
- ``univer`` everywhere (§7.5; block verification on a chain, traversal on trees drawn without
  replacement, so its column checks that identity on real rows; its gain is on i.i.d. trees,
  ``iid_trees``, drafted with replacement and decided by UniVer, where token-wise is RRS);
next to the realised accepted count of the verifier that decided (``decide``: the multi-step
one, block or traversal, by default; or the token-wise one) and the tree's size; each unit
also records the realised tokens per target call. The verifiers are compared **paired**: on
the same drafted steps, so their difference has far less noise than two separate runs.

The multi-step optimum (SPEC.md §7.4) needs the law of the drafted tree and the target's law
of sequences, enumerated (``verifiers.enumeration.TreeDrafter``): only for small vocabularies and
trees. When the pair's vocabulary and the configuration keep the LP within ``optimum_limit``
entries per step, every step's prefix gets the ladder, each rung exact **over the drafts**
(the expectation over the drafted tree at that prefix, computed from full forwards of both
models at every prefix the enumeration meets): token-wise ≤ block / traversal ≤ the best
lossless verifier ≤ the coupling bound. Those are per-step means over the drafts, not given
the drafted tree, so the optimum bounds them step by step; E[τ | tree] of a lucky tree can
exceed it. Budgeted trees have no such law per node prefix (a node's number of children
depends on the whole frontier), so they get none.

Tables average per drafted step (all steps of all prompts pooled), with standard errors
over prompts (prompts as clusters, ``statistics``); they and the report's section are in
``multistep_report``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from specbound.checks import WorkLimitError, positive_int, within_limit
from specbound.datasets import Prompt
from specbound.engine import Processing
from specbound.engine.backends import backend_of
from specbound.engine.methods import Method, build_method
from specbound.models.pair import ModelPair
from specbound.studies.base import Study, Unit, UnitOutput, register_study, setting_units
from specbound.studies.multistep_report import ladder_table, multistep_report, multistep_table
from specbound.studies.options import DECIDERS, DEFAULT_OPTIMUM_LIMIT
from specbound.studies.records import StudyResults
from specbound.studies.sizes import check_some_configuration
from specbound.studies.traces import Trace, checked_generation_settings, generation_summary
from specbound.verifiers import get_verifier
from specbound.verifiers.enumeration import TreeDrafter
from specbound.verifiers.tree import tokenwise_expected_accepted



@dataclass(frozen=True)
class MultistepConfig:
    """One decoding configuration: a chain (``size`` = ``depth`` = γ), a tree (``size`` = n
    drafts per node, ``depth`` = d levels; drawn without replacement, or i.i.d. for "iid_tree")
    or a budgeted sparse tree (``size`` = its node budget, ``depth`` = its largest depth)."""

    kind: str  # "chain", "tree", "iid_tree" or "sparse"
    size: int
    depth: int

    @property
    def label(self) -> str:
        return {"chain": f"chain γ={self.depth}", "tree": f"tree {self.size}×{self.depth}",
                "iid_tree": f"i.i.d. tree {self.size}×{self.depth}",
                "sparse": f"sparse {self.size}/{self.depth}"}[self.kind]

    @property
    def tokenwise(self) -> str:
        """The token-wise verifier of these drafts."""
        return {"chain": "single", "iid_tree": "rrs"}.get(self.kind, "rrs_without_replacement")

    @property
    def multistep(self) -> str:
        """The multi-step verifier of these drafts."""
        return {"chain": "block", "iid_tree": "univer"}.get(self.kind, "traversal")

    @property
    def verifiers(self) -> dict[str, str]:
        """Record key -> verifier name: every verifier that applies to these drafts."""
        compared = {"tokenwise": self.tokenwise, "block": "block", "traversal": "traversal", "univer": "univer"}
        return compared if self.kind == "chain" else {"tokenwise": self.tokenwise, "traversal": "traversal",
                                                      "univer": "univer"}

    @property
    def scheme(self) -> str:
        return "with_replacement" if self.kind in ("chain", "iid_tree") else "without_replacement"

    def method(self, decide: str) -> Method:
        verifier = self.multistep if decide == "multistep" else self.tokenwise
        if self.kind == "chain":
            return build_method("chain", gamma=self.depth, verifier=verifier)
        if self.kind in ("tree", "iid_tree"):
            return build_method("tree", num_drafts=self.size, depth=self.depth, verifier=verifier)
        return build_method("sparse", budget=self.size, depth=self.depth, verifier=verifier)

    def branching(self, depth: int) -> tuple[int, ...] | None:
        """Draws per node by depth for a step drafted ``depth`` deep; None for a budgeted tree."""
        if self.kind == "sparse":
            return None
        return (1 if self.kind == "chain" else self.size,) * depth


def multistep_configs(gammas, trees, sparse, iid_trees=()) -> list[MultistepConfig]:
    """Chains, then trees (n, d), then i.i.d. trees (n, d), then sparse trees (budget, depth), each checked."""
    configs = [MultistepConfig("chain", positive_int("gammas", gamma), gamma) for gamma in gammas]
    configs += [MultistepConfig("tree", positive_int("trees", n), positive_int("trees", d)) for n, d in trees]
    configs += [MultistepConfig("iid_tree", positive_int("iid_trees", n), positive_int("iid_trees", d))
                for n, d in iid_trees]
    configs += [MultistepConfig("sparse", positive_int("sparse", b), positive_int("sparse", d)) for b, d in sparse]
    check_some_configuration(gammas, trees, sparse, iid_trees)
    for config in configs:
        config.method("multistep")  # checks what the engine checks
    return list(dict.fromkeys(configs))


def optimum_entries(vocab_size: int, branching) -> float:
    """The size of one step's best-lossless-verifier LP (``TreeDrafter.lossless_verifier_optimum``),
    an upper bound: drafted trees × Σ_nodes V^(d + 1 − depth), the emitted sequences of each
    node's (next token, target continuation). Trees: a node at depth k with n draws has at
    most V^n draw sequences, each child a subtree of depth k + 1."""
    vocab, depth = float(vocab_size), len(branching)
    trees = 1.0
    for count in reversed(branching):
        trees = vocab**count * trees**count
    widths = np.cumprod([1, *branching], dtype=np.float64)  # nodes per depth
    return trees * sum(width * vocab ** (depth + 1 - level) for level, width in enumerate(widths))


class FullForwards:
    """Token sequence -> a model's next-token law after it, by one plain forward over the
    whole sequence (no cache, no engine), through ``processing``; float64, renormalised,
    memoised. The rows the enumeration of ``TreeDrafter`` asks for, at any prefix."""

    def __init__(self, model, processing: Processing):
        self.model = model
        self.processing = processing
        self.rows: dict[tuple[int, ...], np.ndarray] = {}
        self.backend = backend_of(model)

    def __call__(self, sequence: tuple[int, ...]) -> np.ndarray:
        if sequence not in self.rows:
            logits = self.backend.sequence_logits(self.model, list(sequence), 1)
            row = self.processing.probs(logits)[0].double().numpy()
            self.rows[sequence] = row / row.sum()
        return self.rows[sequence]


def expected_accepted(drafted, verifier) -> float:
    """Exact E[accepted drafts | drafted tree] (SPEC.md §7.3) of a per-node verifier applied
    token-wise, or of a whole-tree verifier."""
    if verifier.per_node:
        return float(tokenwise_expected_accepted(drafted, verifier))
    return float(verifier.expected_accepted(drafted))


def exact_ladder(target: FullForwards, draft: FullForwards, context: list[int], config: MultistepConfig,
                 depth: int) -> dict[str, float]:
    """The ladder at one step's prefix (``context``, its last token the root), each rung exact
    over the drafted tree of ``depth`` levels: token-wise and multi-step verification's
    expected accepted drafts, the best lossless verifier and the coupling bound (SPEC.md §7.4)."""
    before = tuple(context[:-1])
    drafter = TreeDrafter(lambda prefix: target(before + prefix), lambda prefix: draft(before + prefix),
                          config.branching(depth), config.scheme)
    root = context[-1]
    tokenwise, multistep = get_verifier(config.tokenwise), get_verifier(config.multistep)
    coupling = drafter.chain_coupling_optimum(root) if config.kind == "chain" else drafter.coupling_optimum(root)
    return {
        "tokenwise": drafter.expectation(root, lambda tree: expected_accepted(tree, tokenwise)),
        "multistep": drafter.expectation(root, lambda tree: expected_accepted(tree, multistep)),
        "best_lossless": drafter.lossless_verifier_optimum(root),
        "coupling_bound": coupling,
    }


@register_study
class MultistepStudy(Study):
    name = "multistep"

    def __init__(
        self,
        temperatures=(0.7,),
        max_new_tokens: int = 128,
        gammas=(2, 4),
        trees=((2, 2), (3, 3)),
        sparse=(),
        iid_trees=(),
        decide: str = "multistep",
        optimum_limit: int = DEFAULT_OPTIMUM_LIMIT,
        top_k: int | None = None,
        top_p: float | None = None,
    ):
        self.temperatures = checked_generation_settings(temperatures, max_new_tokens, top_k, top_p)
        self.max_new_tokens = max_new_tokens
        self.configs = multistep_configs(gammas, trees, sparse, iid_trees)
        if decide not in DECIDERS:
            raise ValueError(f"decide: expected one of {', '.join(DECIDERS)}, got {decide!r}")
        self.decide = decide
        self.optimum_limit = positive_int("optimum_limit", optimum_limit, minimum=0)
        self.top_k, self.top_p = top_k, top_p

    @classmethod
    def from_arguments(cls, args, generation: dict) -> MultistepStudy:
        return cls(gammas=args.gammas, trees=args.trees, sparse=args.sparse, iid_trees=args.iid_trees,
                   decide=args.decide,
                   optimum_limit=args.optimum_limit, **generation)

    def settings(self) -> dict:
        return {
            "temperatures": self.temperatures,
            "max_new_tokens": self.max_new_tokens,
            "configs": [config.label for config in self.configs],
            "decide": self.decide,
            "optimum_limit": self.optimum_limit,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "generation": "engine; drafts once per step (chains one draw a node, trees without replacement, "
            "i.i.d. trees with it), "
            "every verifier's exact E[accepted | drafted tree] on the same steps",
        }

    def units(self, prompts: list[Prompt]) -> list[Unit]:
        return setting_units(prompts, self.temperatures, self.configs)

    def optimum_status(self, vocab_size: int, config: MultistepConfig) -> str | None:
        """None when the multi-step optimum is computed for ``config``, else why not."""
        if config.kind == "sparse":
            return "not computed: a budgeted tree's shape depends on its whole frontier, not on a node's prefix"
        try:
            within_limit(f"LP at V = {vocab_size:,}", optimum_entries(vocab_size, config.branching(config.depth)),
                         self.optimum_limit, "entries", "--optimum-limit")
        except WorkLimitError as error:
            return f"not computed: {error}"
        return None

    def run_unit(self, pair: ModelPair, unit: Unit, generator: torch.Generator) -> UnitOutput:
        temperature, config = unit.config["temperature"], unit.config["config"]
        processing = Processing(temperature, self.top_k, self.top_p, pair.vocab_size)
        prompt_ids = pair.encode(unit.prompt.text)
        verifiers = {key: get_verifier(name) for key, name in config.verifiers.items()}
        observed, observing = [], [0.0]

        def observe(index: int, tree, target_rows: torch.Tensor) -> None:  # target_rows [nodes, vocab]
            started = time.perf_counter()
            drafted = tree.scored(target_rows)
            observed.append((tree.tokens[0], tree.depth,
                             {key: expected_accepted(drafted, verifier) for key, verifier in verifiers.items()}))
            observing[0] += time.perf_counter() - started

        from specbound.engine.assembly import assemble

        method = config.method(self.decide)
        decoder = assemble(pair, processing, method).decoder
        generation = decoder.generate(prompt_ids, method, self.max_new_tokens, generator, observer=observe)
        stats = generation.stats
        started = time.perf_counter()
        status = self.optimum_status(pair.vocab_size, config)
        if status is None:
            target, draft = FullForwards(pair.target, processing), FullForwards(pair.draft, processing)
        common = {"prompt_id": unit.prompt.id, "temperature": temperature, "config": config.label}
        steps, drafted, emitted = [], iter(observed), 0
        for step, (accepted, size) in enumerate(zip(stats.accepted_lengths, stats.tree_sizes)):
            context = list(prompt_ids) + generation.tokens[:emitted]
            emitted += accepted + 1  # the accepted drafts and one more token (the last step may be cut)
            if size:
                root, depth, expected = next(drafted)
                if root != context[-1]:
                    raise RuntimeError(f"step {step}: the observed tree's root {root} is not the context's last token")
                steps.append({
                    **common, "step": step, "depth": depth, "tree_size": size, "accepted": accepted,
                    "expected": expected,
                    "ladder": None if status else exact_ladder(target, draft, context, config, depth),
                })
        trace = Trace(list(prompt_ids), generation.tokens, generation.finish_reason, stats)
        run = {
            **common, "family": config.kind, "size": config.size, "depth": config.depth, "decide": self.decide,
            "verifiers": config.verifiers,
            "decided_by": config.multistep if self.decide == "multistep" else config.tokenwise,
            "optimum": status or "computed", **generation_summary(pair, trace),
        }
        seconds = {"generate": stats.wall_seconds - observing[0], "exact": observing[0],
                   "optimum": time.perf_counter() - started}
        return UnitOutput(steps, run, seconds)

    @staticmethod
    def summary_tables(results) -> list:
        return [("expected accepted drafts per step on the same drafted steps (± s.e. over prompts)",
                 multistep_table(results)),
                ("the ladder, exact over the drafts at each step's prefix (± s.e. over prompts)",
                 ladder_table(results))]

    @staticmethod
    def report_section(results: StudyResults, figure_dir: Path) -> list:
        return multistep_report(results, figure_dir)
