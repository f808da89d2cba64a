"""Suffix decoding on a multi-turn code-editing workload: its trees against the same drafts
verified as a chain, prompt lookup (ours and llama-cpp-python's) and plain decoding, all on
the embedded target's GGUF file on llama.cpp's kernels.

**The workload** (shipped: ``specbound.datasets``' ``edit`` prompts). Each conversation is
one edit prompt, then ``--turns`` − 1 revisions: turn k's prompt is the first prompt, the
previous turn's answer and an instruction to revise it and return the whole code again
(``REVISIONS``), so later answers repeat earlier ones with changes. Every decoder is given
the same prompts: the answer a turn's prompt quotes is plain decoding's (it runs first in
each unit), so the decoders differ only in how they decode. The suffix decoders keep their
history of earlier outputs across turns and conversations, as a server does across requests.

**Decoders**, interleaved turn by turn in a rotating order (drift hits all alike):
- ``plain``: ours, autoregressive;
- ``suffix tree``: ours, suffix drafts as a budgeted tree (``SUFFIX_TREE``), verified node by
  node with the optimal rule for fixed drafts (``engine.suffix``);
- ``suffix chain``: the same drafter as a chain of the tree's depth — the tree's most frequent
  path, verified as a chain;
- ``lookup``: our prompt lookup, a chain of the same depth;
- ``llama.cpp lookup``: llama-cpp-python's ``LlamaPromptLookupDecoding`` (its defaults) in its
  own generation loop; its target calls are its ``eval`` calls after the prompt's.
- with ``--auto``: ``auto (suffix)``, the planner choosing among plain decoding, prompt
  lookup and suffix drafts on this machine's measured costs.

**Paired** (``--paired``, instead of the above): the suffix tree decoder alone, and at every
step it drafts, the exact expected tokens of that step, 1 + Σ_v p(path to v), for the tree
and for the chain it holds (the chain decoder's drafts for the same context), from the
target rows of the one call: the two verified on the same contexts, without the noise of
sampling two different texts. Recorded as one JSON object (``drafting/suffix_paired.json``).

**Figures.** Tokens per target call (prefill excluded) is the robust one: it does not depend
on the load of the machine. Tokens/s is end to end (prefill included) and, where the
machine is shared, noisy. Ratios are of totals over the conversations, with a standard
error by the delta method over conversations (turns of one conversation are not
independent). One JSON line per (conversation, turn, decoder) goes to ``--output`` after the
run's envelope (``benchmarks.record``); a rerun with the same ``--output`` skips what is
there; the table at the end reads the whole file.

    python -m benchmarks.drafting.bench_suffix --limit 4 --turns 3 --max-new-tokens 128 --threads 2
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from benchmarks import record
from specbound.datasets import load_prompts
from specbound.engine import Processing, build_method
from specbound.engine.assembly import assemble
from specbound.engine.decode import Decoder
from specbound.engine.methods import Levels
from specbound.engine.suffix import SuffixDrafter, best_first, continuations
from specbound.models.loading import gguf_file
from specbound.models.pair import load_pair

CONTEXT = 4096  # llama-cpp-python's context for its own runs (every turn's prompt and answer fits)
DEPTH = 8
SUFFIX_TREE = {"budget": 16, "depth": DEPTH, "width": 4, "max_children": 3}
REVISIONS = (
    "Now add type hints to every function signature and return the whole code again.",
    "Now add a one-line docstring to every function and return the whole code again.",
    "Now rename the variables to clearer names where it helps and return the whole code again.",
)


def turn_prompt(first: str, answer: str, turn: int) -> str:
    """Turn ``turn``'s prompt (0: the first one): the first prompt, the last answer, a revision."""
    if turn == 0:
        return first
    return f"{first}\n\nYour answer was:\n\n{answer}\n\n{REVISIONS[(turn - 1) % len(REVISIONS)]}"


def engine_runner(decoder, method):
    def run(prompt_ids, seed, max_new_tokens):
        generation = decoder.generate(prompt_ids, method, max_new_tokens, torch.Generator().manual_seed(seed))
        stats = generation.stats
        return generation.tokens, {"target_calls": stats.target_calls, "tree_sizes": sum(stats.tree_sizes),
                                   "accepted": sum(stats.accepted_lengths),
                                   "decoding_seconds": stats.wall_seconds - stats.seconds["prefill"],
                                   "plan": method.describe()}

    return run


def llama_runner(llama, temperature: float, stop_ids):
    """llama-cpp-python's loop; its target forwards counted at ``eval`` (the first is the prompt's)."""
    calls = [0]
    evaluate = llama.eval

    def counted(tokens):
        calls[0] += 1
        return evaluate(tokens)

    llama.eval = counted

    def run(prompt_ids, seed, max_new_tokens):
        llama.reset()
        llama.set_seed(seed)
        calls[0] = 0
        tokens = []
        for token in llama.generate(prompt_ids, temp=temperature, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0,
                                    repeat_penalty=1.0):
            tokens.append(int(token))
            if token in stop_ids or len(tokens) >= max_new_tokens:
                break
        return tokens, {"target_calls": calls[0] - 1}

    return run


class ChainBeside(SuffixDrafter):
    """The suffix drafter, noting beside each tree the tokens of the chain of its depth that
    the chain decoder would draft for the same context (``best_first`` puts it in the tree)."""

    last_chain: list[int] = []

    def draft_one(self, sources, context, method, depth, generator):
        total, trie = continuations(sources, context, depth, self.max_match, self.min_match, self.max_occurrences)
        chain = best_first(trie, total, Levels((1,) * depth), depth) if total and depth > 0 else []
        self.last_chain = [token for _, token, _ in chain]
        return super().draft_one(sources, context, method, depth, generator)


def paired(pair, processing, conversations, args) -> dict:
    """Per drafted step of the suffix tree decoder, the exact expected tokens of its tree and of
    the chain inside it, on the same context (module docstring)."""
    drafter = ChainBeside(pair.vocab_size)
    decoder = Decoder(pair.backend.language_model(pair.target, None), drafter, processing, pair.eos_token_ids)
    method = build_method("sparse", **SUFFIX_TREE)
    steps = []

    def observe(index, tree, target_rows):
        rows = target_rows.double().numpy()
        rows /= rows.sum(axis=1, keepdims=True)
        reach = np.ones(len(tree))
        for node in range(1, len(tree)):
            reach[node] = reach[tree.parents[node]] * rows[tree.parents[node], tree.tokens[node]]
        node, chain = 0, 0.0
        for token in drafter.last_chain:
            node = tree.children[node][token]  # KeyError: the tree does not hold the chain
            chain += reach[node]
        steps.append((conversation_index, 1.0 + reach[1:].sum(), 1.0 + chain))

    units = 0
    for conversation_index, conversation in enumerate(conversations):
        answer = ""
        for turn in range(args.turns):
            prompt_ids = pair.encode(turn_prompt(conversation.text, answer, turn))
            generation = decoder.generate(prompt_ids, method, args.max_new_tokens,
                                          torch.Generator().manual_seed(args.seed + units), observer=observe)
            answer = pair.decode(generation.tokens, skip_special_tokens=True)
            units += 1
    by_conversation = np.zeros((len(conversations), 2))  # [conversation, (tree, chain)] expected tokens summed
    for index, tree, chain in steps:
        by_conversation[index] += (tree, chain)
    totals = by_conversation.sum(axis=0)
    ratio = totals[0] / totals[1]
    influence = by_conversation[:, 0] / totals[0] - by_conversation[:, 1] / totals[1]  # delta method, per conversation
    clusters = len(conversations)
    error = float(ratio * np.sqrt(clusters / (clusters - 1) * (influence ** 2).sum())) if clusters > 1 else float("nan")
    return {"steps": len(steps), "tree_expected_tokens_per_step": by_conversation[:, 0].sum() / len(steps),
            "chain_expected_tokens_per_step": by_conversation[:, 1].sum() / len(steps),
            "ratio": ratio, "standard_error": error, "by_conversation": by_conversation.tolist(),
            "conversations": [conversation.id for conversation in conversations]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="default-target")
    parser.add_argument("--limit", type=int, default=4, help="conversations (edit prompts)")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of every decoder")
    parser.add_argument("--auto", action="store_true", help="add the planner choosing among them")
    parser.add_argument("--paired", action="store_true", help="only the paired exact tree/chain comparison")
    record.add_output(parser, "drafting/suffix.jsonl")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    pair = load_pair(args.target, None, backend="llama.cpp", progress=False, threads=args.threads)
    processing = Processing(args.temperature, vocab_size=pair.vocab_size)
    if args.paired:  # the answers quoted are the tree decoder's own: the same contexts for both
        result = paired(pair, processing, load_prompts("edit", limit=args.limit), args)
        print(f"{result['steps']} drafted steps, expected tokens per call: tree "
              f"{result['tree_expected_tokens_per_step']:.3f}, chain {result['chain_expected_tokens_per_step']:.3f}, "
              f"ratio {result['ratio']:.3f} ± {result['standard_error']:.3f}")
        record.write(args.output if args.output.suffix == ".json" else args.output.with_name("suffix_paired.json"),
                     {**result, "temperature": args.temperature, "max_new_tokens": args.max_new_tokens,
                      "turns": args.turns, "suffix_tree": SUFFIX_TREE})
        return 0
    target_path, _ = gguf_file(args.target, progress=False)
    llama = Llama(str(target_path), draft_model=LlamaPromptLookupDecoding(), n_ctx=CONTEXT, n_batch=512,
                  n_threads=args.threads, n_threads_batch=args.threads, flash_attn=True, verbose=False,
                  logits_all=True)  # with a draft model Llama sizes its logits by n_batch unless asked for all
    runners = {
        "plain": engine_runner(*assemble(pair, processing, build_method("autoregressive"))),
        "suffix tree": engine_runner(*assemble(pair, processing, build_method("sparse", **SUFFIX_TREE),
                                               drafter="suffix")),
        "suffix chain": engine_runner(*assemble(pair, processing, build_method("chain", gamma=DEPTH),
                                                drafter="suffix")),
        "lookup": engine_runner(*assemble(pair, processing, build_method("chain", gamma=DEPTH),
                                          drafter="prompt-lookup")),
        "llama.cpp lookup": llama_runner(llama, args.temperature, set(pair.eos_token_ids)),
    }
    if args.auto:
        runners["auto (suffix)"] = engine_runner(*assemble(pair, processing, "auto", drafter="suffix"))
    for label, runner in runners.items():  # the first forwards are slow: not timed
        if "auto" not in label:
            runner(pair.encode("Say hi."), args.seed, 3)

    settings = {"threads": args.threads, "temperature": args.temperature, "max_new_tokens": args.max_new_tokens,
                "turns": args.turns, "suffix_tree": SUFFIX_TREE, "depth": DEPTH}
    done = {(result["conversation"], result["turn"], result["method"]): result
            for result in record.results(args.output)}
    lines = record.Lines(args.output)
    unit = 0
    for conversation in load_prompts("edit", limit=args.limit):
        answer = ""
        for turn in range(args.turns):
            prompt_ids = pair.encode(turn_prompt(conversation.text, answer, turn))
            labels = list(runners)
            labels = ["plain"] + [label for label in labels[unit % len(labels):] + labels[: unit % len(labels)]
                                  if label != "plain"]  # plain first: its answer is the next turn's
            for label in labels:
                key = (conversation.id, turn, label)
                if key not in done:
                    started = time.perf_counter()
                    tokens, stats = runners[label](prompt_ids, args.seed + unit, args.max_new_tokens)
                    done[key] = {"conversation": conversation.id, "turn": turn, "method": label,
                                 "prompt_tokens": len(prompt_ids), "new_tokens": len(tokens), "tokens": tokens,
                                 "seconds": time.perf_counter() - started, **stats, **settings}
                    lines.append(done[key])
                    print(f"{conversation.id} turn {turn} {label}: {len(tokens)} tokens, "
                          f"{len(tokens) / max(done[key]['target_calls'], 1):.2f}/call", file=sys.stderr)
                if label == "plain":
                    answer = pair.decode(done[key]["tokens"], skip_special_tokens=True)
            unit += 1
    report(args.output)
    return 0


def report(path: Path) -> None:
    """Per decoder, tokens per target call and tokens/s over the conversations, and each one's
    ratio to the suffix chain and to plain decoding (± standard error over conversations)."""
    by_conversation = defaultdict(lambda: defaultdict(lambda: np.zeros(3)))  # label -> conversation -> sums
    for result in record.results(path):
        sums = by_conversation[result["method"]][result["conversation"]]
        sums += (result["new_tokens"], result["target_calls"], result["seconds"])
    labels = list(by_conversation)
    conversations = sorted(set.intersection(*(set(by_conversation[label]) for label in labels)))
    totals = {label: np.array([by_conversation[label][conversation] for conversation in conversations])
              for label in labels}

    print(f"{len(conversations)} conversations")
    print("| decoder | tokens | tokens/target call | × suffix chain | tokens/s | × suffix chain | × plain |")
    print("|---|---|---|---|---|---|---|")
    for label in labels:
        tokens, calls, seconds = totals[label].sum(axis=0)
        cells = [label, f"{tokens:.0f}", f"{tokens / calls:.2f}" if calls else "—"]
        cells.append(_shown(*ratio_of_rates(totals[label], totals["suffix chain"], 1)) if calls else "—")
        cells += [f"{tokens / seconds:.2f}", _shown(*ratio_of_rates(totals[label], totals["suffix chain"], 2)),
                  _shown(*ratio_of_rates(totals[label], totals["plain"], 2))]
        print("| " + " | ".join(cells) + " |")


def ratio_of_rates(mine: np.ndarray, theirs: np.ndarray, column: int) -> tuple[float, float]:
    """(tokens / column) of ``mine`` over that of ``theirs``, totals over conversations, and the
    standard error by the delta method over conversations (rows: [tokens, calls, seconds])."""
    totals_mine, totals_theirs = mine.sum(axis=0), theirs.sum(axis=0)
    value = (totals_mine[0] / totals_mine[column]) / (totals_theirs[0] / totals_theirs[column])
    clusters = len(mine)
    if clusters < 2:
        return value, float("nan")
    # log value = log T_m − log C_m − log T_t + log C_t: each conversation's share of each sum
    # is its influence (they sum to 0)
    influence = (mine[:, 0] / totals_mine[0] - mine[:, column] / totals_mine[column]
                 - theirs[:, 0] / totals_theirs[0] + theirs[:, column] / totals_theirs[column])
    return value, float(value * np.sqrt(clusters / (clusters - 1) * (influence ** 2).sum()))


def _shown(value: float, error: float) -> str:
    return f"{value:.2f} ± {error:.2f}" if np.isfinite(error) else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(main())
