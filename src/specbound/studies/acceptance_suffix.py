"""The acceptance study with ``--drafter suffix``: suffix decoding's drafts along the
target's own texts, exactly (``engine.suffix``; SPEC.md §6, deterministic drafts).

No draft model is loaded: the drafts come from what followed earlier occurrences of the
context's suffix, in the unit's prompt and text so far and in a **history** of earlier
outputs. The history is global, as a server's is across requests: a unit drafts from the
outputs of every unit before it in the study's unit order — prompt by prompt, each prompt's
temperatures in turn (``suffix_units``), so a larger ``--limit`` only adds units after those
written. A run rebuilds the history from the records already written before it decodes
(``SuffixHistoryRun.restore``): the figures are the same in one go, in batches, or
interrupted and resumed.

Per position t of a unit's text (the target's sample; p_t the law the engine sampled token t
from):
- S_t: the root's children in the tree the suffix drafter drafts at that context with the
  study's tree (``SUFFIX_TREE``, at its full depth), empty where no suffix of the context
  matches. The drafts are a fixed set, whatever the verifier's randomness, so a lossless
  verifier emits y ~ p_t and accepts exactly when y ∈ S_t: the one-step acceptance is
  p_t(S_t), which is also α*, the most any lossless verifier accepts with those drafts;
- top_t: what the chain of the tree's depth drafts first, the most frequent continuation, and
  its acceptance p_t(top_t). The budgeted tree holds that chain, so top_t ∈ S_t and
  p_t(S_t) ≥ p_t(top_t).
Per unit: ``engine.replay`` of the text with the tree and with the chain — the drafts
each step of suffix decoding accepts when it emits this text. The text is a sample of the
target's law and suffix decoding is lossless, so these accepted lengths are a sample of the
engine's own: tokens per target call = len(text) / steps (prefill excluded).

Records: the acceptance study's, one position record per position with n = the tree's most
children a node, "acceptance" {suffix_tree: p_t(S_t), suffix_chain: p_t(top_t)}, "drafts"
{suffix_tree: S_t, suffix_chain: [top_t] or []} (likeliest first) and no tail cut (whole
rows: tail_mass 0, B = 0); the run record's "suffix": the history the unit drafted from and
each method's accepted drafts per step.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from specbound.datasets import Prompt
from specbound.engine.methods import Method, build_method
from specbound.engine.replay import replay
from specbound.engine.suffix import (MAX_HISTORY_TOKENS, MAX_MATCH, MAX_OCCURRENCES, MIN_MATCH, SuffixDrafter,
                                     SuffixHistory, SuffixText)
from specbound.engine.tree import DraftTree
from specbound.statistics import grouped_per_token_means, per_token_mean
from specbound.studies.base import Unit, setting_units
from specbound.studies.document import Heading, Paragraph, Table, estimate
from specbound.studies.records import StudyResults

SUFFIX_TREE = {"budget": 16, "depth": 8, "width": 4, "max_children": 3}  # the tree benchmarks/drafting measures
SUFFIX_METHODS = ("suffix_tree", "suffix_chain")  # the tree, and the chain of its depth
HISTORY_ORDER = "prompt by prompt, each prompt's temperatures in turn; each unit drafts from every earlier unit"


def suffix_methods(tree: dict) -> dict[str, Method]:
    """The study's two ways to verify suffix drafts: the budgeted tree ``tree`` (options of
    the ``sparse`` method) and the chain of its depth."""
    return {"suffix_tree": build_method("sparse", **tree), "suffix_chain": build_method("chain", gamma=tree["depth"])}


def suffix_settings(tree: dict) -> dict:
    """What the study's settings record of its suffix drafts."""
    return {"drafter": "suffix", "suffix_tree": dict(tree), "suffix_chain": {"gamma": tree["depth"]},
            "suffix_history": {"max_tokens": MAX_HISTORY_TOKENS, "max_match": MAX_MATCH, "min_match": MIN_MATCH,
                               "max_occurrences": MAX_OCCURRENCES, "order": HISTORY_ORDER}}


def suffix_units(prompts: list[Prompt], temperatures) -> list[Unit]:
    """The units in history order: prompt by prompt, each prompt's temperatures in turn."""
    return [unit for prompt in prompts for unit in setting_units([prompt], temperatures)]


def root_drafts(tree: DraftTree) -> list[int]:
    """The root's drafted tokens, likeliest first by the drafter's law (ties by token)."""
    if not tree.children[0]:
        return []
    draft_probs = tree.draft_probs[0]  # [vocab]
    return sorted(tree.children[0], key=lambda token: (-float(draft_probs[token]), token))


class SuffixHistoryRun:
    """One study run's suffix drafters and their global history (module docstring): one
    drafter per method, each with its own copy of the history, fed the same outputs in unit
    order (``replay`` adds the text it replays to its drafter's history)."""

    def __init__(self, vocab_size: int, tree: dict, order: list[str]):
        self.methods = suffix_methods(tree)
        self.drafters = {name: SuffixDrafter(vocab_size, SuffixHistory(MAX_HISTORY_TOKENS, MAX_MATCH), MAX_MATCH,
                                             MIN_MATCH, MAX_OCCURRENCES) for name in self.methods}
        self.order = list(order)  # unit keys in history order
        self.added = 0  # the outputs of order[:added] are in the history

    def restore(self, written: dict[str, tuple[list[int], list[int], bool]]) -> None:
        """Add the outputs of the units written before (key -> (prompt ids, generated
        tokens, whether the output joined the history)), which must be the first of the
        order; keys outside it are ignored."""
        keys = [key for key in self.order if key in written]
        if keys != self.order[: len(keys)]:
            missing = next(key for key in self.order if key not in written)
            raise ValueError(f"out: the records hold units after {missing!r}, which is not written; suffix drafts "
                             "draw on every earlier unit's output, so those records drafted from another history: "
                             "choose another --out")
        for key in keys:
            prompt_ids, tokens, joined = written[key]
            for drafter in self.drafters.values():
                if joined:
                    drafter.history.add(tokens, prompt_ids)
        self.added = len(keys)

    def unit(self, key: str, prompt_ids: list[int], tokens: list[int], target_rows: np.ndarray,
             max_new_tokens: int) -> tuple[list[dict], dict]:
        """The unit's per-position figures (position, token, acceptance, drafts) and its run
        record's "suffix"; then its output joins the history as the engine's would (where the
        drafter drafted for it: "joined_history").  # target_rows [len(tokens), vocab]"""
        if self.added >= len(self.order) or self.order[self.added] != key:
            expected = self.order[self.added] if self.added < len(self.order) else "none"
            raise ValueError(f"unit: {key!r} out of history order (next: {expected!r}); suffix units run one "
                             "process in unit order (run_study), not on Ray")
        history = self.drafters["suffix_tree"].history
        before = history.snapshot()
        summary = {"history_outputs": len(before), "history_tokens": history.num_tokens}
        positions = self._positions(prompt_ids, tokens, target_rows, list(reversed(before)))
        summary["accepted"] = {name: replay(self.drafters[name], method, prompt_ids, tokens, max_new_tokens)
                               for name, method in self.methods.items()}
        after = history.snapshot()
        summary["joined_history"] = bool(after) and (not before or after[-1] is not before[-1])
        self.added += 1
        return positions, summary

    def _positions(self, prompt_ids, tokens, target_rows, history) -> list[dict]:
        context, text = list(prompt_ids), SuffixText(prompt_ids)
        generator = torch.Generator().manual_seed(0)  # orders a node's drafts only: the set is fixed
        positions = []
        for position, token in enumerate(tokens):
            sources = [[text], history]
            drafts = {name: root_drafts(self.drafters[name].draft_one(sources, context, method, method.depth,
                                                                      generator))
                      for name, method in self.methods.items()}
            target_probs = target_rows[position]  # [vocab]
            positions.append({"position": position, "token": token,
                              "acceptance": {name: float(target_probs[drafted].sum()) if drafted else 0.0
                                             for name, drafted in drafts.items()},
                              "drafts": drafts})
            context.append(token)
            text.extend([token])
        return positions


# -- tables and report ------------------------------------------------------------------------
ONE_STEP = {  # quantity -> (label, its value at a position record)
    "suffix_tree": ("p(S): the tree's root drafts S (= α*)", lambda record: record["acceptance"]["suffix_tree"]),
    "suffix_chain": ("p(top): the chain's first draft", lambda record: record["acceptance"]["suffix_chain"]),
    "difference": ("p(S) − p(top), paired",
                   lambda record: record["acceptance"]["suffix_tree"] - record["acceptance"]["suffix_chain"]),
    "drafted": ("positions with a draft", lambda record: float(bool(record["drafts"]["suffix_tree"]))),
}


def suffix_summary(results: StudyResults) -> dict[tuple, tuple[float, float, int]]:
    """(temperature, quantity of ``ONE_STEP``) -> (per-token mean, standard error over
    prompts, positions)."""
    summary = {}
    for quantity, (_, value) in ONE_STEP.items():
        means = grouped_per_token_means(results.positions, lambda record: (record["temperature"],), value)
        summary.update({(temperature, quantity): entry for (temperature,), entry in means.items()})
    return summary


def replay_summary(results: StudyResults) -> dict[tuple, tuple[float, float, int]]:
    """(temperature, method or "ratio") -> (value, standard error over prompts, units):
    each method's tokens per target call on the texts, Σ tokens / Σ calls, and the ratio
    tree ÷ chain = Σ calls of the chain / Σ calls of the tree (``statistics.per_token_mean``:
    ratios of sums, their errors by the delta method, each prompt one cluster)."""
    runs = defaultdict(list)
    for run in results.runs:
        runs[run["temperature"]].append(run)
    summary = {}
    for temperature, group in runs.items():
        tokens = [len(run["tokens"]) for run in group]
        calls = {name: [len(run["suffix"]["accepted"][name]) for run in group] for name in SUFFIX_METHODS}
        for name in SUFFIX_METHODS:
            summary[(temperature, name)] = (*per_token_mean(tokens, calls[name]), len(group))
        summary[(temperature, "ratio")] = (*per_token_mean(calls["suffix_chain"], calls["suffix_tree"]), len(group))
    return summary


def suffix_tables(results: StudyResults) -> list[tuple[str, tuple[list, list]]]:
    """(title, (headers, rows)): the one-step figures per token, and tokens per target call."""
    temperatures = results.settings["temperatures"]
    headers = [""] + [f"T={temperature:g}" for temperature in temperatures]
    one_step, replayed = suffix_summary(results), replay_summary(results)
    tree, gamma = results.settings["suffix_tree"], results.settings["suffix_chain"]["gamma"]
    labels = {"suffix_tree": f"suffix tree, {tree['budget']} nodes, depth {tree['depth']}, width {tree['width']}, "
                             f"≤ {tree['max_children']} children",
              "suffix_chain": f"suffix chain, γ = {gamma}", "ratio": "tree ÷ chain"}
    return [
        ("suffix drafts, exact one-step acceptance per token (± s.e. over prompts)",
         (headers, [[label] + [estimate(one_step.get((temperature, quantity))) for temperature in temperatures]
                    for quantity, (label, _) in ONE_STEP.items()])),
        ("suffix decoding on these texts, tokens per target call (replayed; ± s.e. over prompts)",
         (headers, [[label] + [estimate(replayed.get((temperature, name)), 3) for temperature in temperatures]
                    for name, label in labels.items()])),
    ]


def suffix_report(studies: list[StudyResults]) -> list:
    """The report's section for the acceptance studies run with ``--drafter suffix``."""
    if not studies:
        return []
    blocks = [
        Heading(2, "Acceptance study with suffix drafts (SPEC.md §6)"),
        Paragraph(
            "No draft model: at every position of the target's own texts, suffix decoding drafts from what followed "
            "earlier occurrences of the context's suffix, in the prompt, the text so far and the outputs of every "
            "earlier prompt (a global history, as a server keeps across requests). The root's drafts S are a fixed "
            "set, so a lossless verifier accepts exactly when the target's token falls in S: p(S), computed from "
            "the target's row, is the exact acceptance and α*, the most any lossless verifier can accept with those "
            "drafts; p(top) is the chain's, its one most frequent continuation. Tokens per target call replay "
            "suffix decoding on each text (the drafts each step accepts when it emits that text): exactly in law "
            "the engine's, since the text is the target's sample. ± is one standard error over prompts."),
    ]
    for results in studies:
        for title, table in suffix_tables(results):
            blocks += [Heading(3, f"{results.settings['dataset']}: {title}"), Table(*table)]
    return blocks
