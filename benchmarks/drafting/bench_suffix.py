"""Suffix decoding on two shipped repetitive workloads: its trees against the same drafts
verified as a chain, prompt lookup (ours and llama-cpp-python's) and plain decoding, all on
the embedded target's GGUF file on llama.cpp's kernels.

**Workloads** (``--workload``; prompts from ``specbound.datasets``):
- ``edit``: each conversation is one ``edit`` prompt, then ``--turns`` − 1 revisions: turn
  k's prompt is the first prompt, the previous turn's answer and an instruction to revise
  it and return the whole code again (``REVISIONS``), so later answers repeat earlier ones
  with changes. The answer a turn's prompt quotes is plain decoding's, so every decoder is
  given the same prompts.
- ``rollouts``: ``--samples`` answers to each ``humaneval`` prompt, one after another, as a
  reinforcement-learning loop or best-of-n sampling asks for them: later answers repeat
  earlier ones and branch where the target's law does.
The suffix decoders keep their history of earlier outputs across turns, samples and
prompts, as a server does across requests.

**Replay** (``--replay``): plain decoding alone generates the workload's texts (kept line by
line in ``--texts``: a rerun keeps those of the same seed, prompt, length and temperature),
then every decoder whose drafts are fixed by the context is replayed on the same texts
(``engine.replay``): at each step it accepts the deepest drafted path the target's text
begins with — exactly in law what the engine accepts, with no target forward. The decoders
are compared paired, on the same texts, without the noise of sampling different ones: suffix
trees (``SUFFIX_TREE`` and a larger one), the same drafts as a chain of the tree's depth
(the tree's most frequent path), our prompt lookup. One JSON record
(``drafting/suffix_replay_<workload>.json``).

**Live** (default): the decoders interleaved unit by unit in a rotating order (drift hits
all alike), timed end to end:
- ``plain``: ours, autoregressive;
- ``suffix tree``: ours, suffix drafts as a budgeted tree (``SUFFIX_TREE``), verified node by
  node with the optimal rule for fixed drafts (``engine.suffix``);
- ``suffix chain``: the same drafter as a chain of the tree's depth;
- ``lookup``: our prompt lookup, a chain of the same depth;
- ``llama.cpp lookup``: llama-cpp-python's ``LlamaPromptLookupDecoding`` (its defaults) in its
  own generation loop; its target calls are its ``eval`` calls after the prompt's.
- with ``--auto``: ``auto (suffix)``, the planner choosing among plain decoding, prompt
  lookup and suffix drafts on this machine's measured costs.

**Figures.** Tokens per target call (prefill excluded) is the robust one: it does not depend
on the load of the machine. Tokens/s is end to end (prefill included) and, where the
machine is shared, noisy. Ratios are of totals, with a standard error by the delta method
over conversations (``edit``) or prompts (``rollouts``): the units of one are not
independent. Live: one JSON line per (conversation, unit, decoder) goes to ``--output``
after the run's envelope (``benchmarks.record``), the tokens only of plain decoding's (the
text the next turn quotes); a rerun with the same ``--output`` skips what is there; the table
at the end reads the whole file.

    python -m benchmarks.drafting.bench_suffix --replay --workload rollouts --limit 8 --samples 8
    python -m benchmarks.drafting.bench_suffix --workload edit --limit 4 --turns 3 --max-new-tokens 96 --auto
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
from benchmarks.llamacpp.bench_llamacpp import llama_runner
from specbound.datasets import load_prompts
from specbound.engine import Processing, build_method
from specbound.engine.assembly import assemble
from specbound.engine.decode import Decoder
from specbound.engine.drafters import PromptLookupDrafter
from specbound.engine.replay import replay
from specbound.engine.suffix import SuffixDrafter
from specbound.models.loading import gguf_file
from specbound.models.pair import load_pair

CONTEXT = 4096  # llama-cpp-python's context for its own runs (every turn's prompt and answer fits)
DEPTH = 8
SUFFIX_TREE = {"budget": 16, "depth": DEPTH, "width": 4, "max_children": 3}
SUFFIX_TREES = {"suffix tree": SUFFIX_TREE,
                "suffix tree 32": {"budget": 32, "depth": DEPTH, "width": 8, "max_children": 4}}
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
        plans_before = method.plans_made
        generation = decoder.generate(prompt_ids, method, max_new_tokens, torch.Generator().manual_seed(seed))
        stats = generation.stats
        return generation.tokens, {"target_calls": stats.target_calls, "tree_sizes": sum(stats.tree_sizes),
                                   "accepted": sum(stats.accepted_lengths),
                                   "decoding_seconds": stats.wall_seconds - stats.seconds["prefill"],
                                   "plan": method.describe(since=plans_before)}

    return run


def workload(args, pair, answer_of):
    """The workload's units in order, as (cluster, unit, prompt ids): a conversation's turns or a
    prompt's samples; ``answer_of(cluster, unit)`` is plain decoding's answer to a unit, asked
    for once the caller has it (the next turn of a conversation quotes it)."""
    if args.workload == "edit":
        for conversation in load_prompts("edit", limit=args.limit):
            answer = ""
            for turn in range(args.turns):
                yield conversation.id, turn, pair.encode(turn_prompt(conversation.text, answer, turn))
                answer = pair.decode(answer_of(conversation.id, turn), skip_special_tokens=True)
    else:
        for prompt in load_prompts("humaneval", limit=args.limit):
            prompt_ids = pair.encode(prompt.text)
            for sample in range(args.samples):
                yield prompt.id, sample, prompt_ids


def replayed(pair, processing, args) -> dict:
    """Plain decoding's texts of the workload (generated into ``args.texts`` where missing), then
    every fixed-draft decoder replayed on them (module docstring)."""
    texts = {(line["cluster"], line["unit"]): line for line in record.results(args.texts)
             if (line["max_new_tokens"], line["temperature"]) == (args.max_new_tokens, args.temperature)}
    plain = engine_runner(*assemble(pair, processing, build_method("autoregressive")))
    lines = None
    order = []
    for index, (cluster, unit, prompt_ids) in enumerate(workload(args, pair, lambda *key: texts[key]["tokens"])):
        known = texts.get((cluster, unit))
        if known is None or (known.get("seed"), known["prompt"]) != (args.seed + index, prompt_ids):
            lines = lines or record.Lines(args.texts)
            started = time.perf_counter()
            tokens, _ = plain(prompt_ids, args.seed + index, args.max_new_tokens)
            texts[cluster, unit] = {"cluster": cluster, "unit": unit, "prompt": prompt_ids, "tokens": list(tokens),
                                    "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
                                    "seed": args.seed + index}
            lines.append(texts[cluster, unit])
            print(f"{cluster} {unit}: {len(tokens)} tokens in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        order.append((cluster, unit))
    decoders = {
        **{label: (SuffixDrafter, build_method("sparse", **shape)) for label, shape in SUFFIX_TREES.items()},
        "suffix chain": (SuffixDrafter, build_method("chain", gamma=DEPTH)),
        "lookup": (PromptLookupDrafter, build_method("chain", gamma=DEPTH)),
    }
    clusters = list(dict.fromkeys(cluster for cluster, _ in order))
    sums = {}  # label -> [cluster, (tokens, target calls, calls with drafts)]
    for label, (drafter_class, method) in decoders.items():
        drafter, sums[label] = drafter_class(pair.vocab_size), np.zeros((len(clusters), 3))
        for cluster, unit in order:  # one drafter: the suffix history grows across the whole workload
            text = texts[cluster, unit]
            accepted = replay(drafter, method, text["prompt"], text["tokens"], args.max_new_tokens)
            sums[label][clusters.index(cluster)] += (len(text["tokens"]), len(accepted),
                                                     sum(length > 0 for length in accepted))
    result = {"workload": args.workload, "clusters": clusters, "units": len(order),
              "tokens": int(sums["suffix chain"][:, 0].sum()), "decoders": {}}
    for label, by_cluster in sums.items():
        tokens, calls, accepting = by_cluster.sum(axis=0)
        ratio, error = ratio_of_rates(by_cluster, sums["suffix chain"], 1)
        result["decoders"][label] = {"tokens_per_call": tokens / calls, "ratio_to_suffix_chain": ratio,
                                     "standard_error": error if np.isfinite(error) else None,
                                     "calls_accepting_a_draft": accepting / calls,
                                     "by_cluster": by_cluster[:, :2].tolist()}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="default-target")
    parser.add_argument("--workload", choices=["edit", "rollouts"], default="edit")
    parser.add_argument("--limit", type=int, default=4, help="conversations (edit) or prompts (rollouts)")
    parser.add_argument("--turns", type=int, default=3, help="edit: turns of a conversation")
    parser.add_argument("--samples", type=int, default=8, help="rollouts: answers to each prompt")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of every decoder")
    parser.add_argument("--auto", action="store_true", help="add the planner choosing among them")
    parser.add_argument("--replay", action="store_true", help="plain decoding's texts, every fixed-draft decoder "
                        "replayed on them (module docstring)")
    parser.add_argument("--texts", type=Path, help="--replay: the texts' JSON lines (default: beside --output)")
    record.add_output(parser, "drafting/suffix.jsonl")
    args = parser.parse_args()
    for option in ("limit", "turns", "samples", "max_new_tokens", "threads"):
        if getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')}: expected a positive integer, got {getattr(args, option)}")
    torch.set_num_threads(args.threads)
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    pair = load_pair(args.target, None, backend="llama.cpp", progress=False, threads=args.threads)
    processing = Processing(args.temperature, vocab_size=pair.vocab_size)
    if args.workload != "edit" and args.output == record.RESULTS / "drafting/suffix.jsonl":
        args.output = args.output.with_name(f"suffix_{args.workload}.jsonl")
    if args.replay:
        output = args.output if args.output.suffix == ".json" else \
            args.output.with_name(f"suffix_replay_{args.workload}.json")
        args.texts = args.texts or Path("specbound-results") / f"suffix_texts_{args.workload}.jsonl"
        args.texts.parent.mkdir(parents=True, exist_ok=True)
        result = replayed(pair, processing, args)
        print(f"{result['units']} texts, {result['tokens']} tokens")
        print("| decoder | tokens/target call | × suffix chain | calls accepting a draft |")
        print("|---|---|---|---|")
        for label, figures in result["decoders"].items():
            print(f"| {label} | {figures['tokens_per_call']:.3f} | "
                  f"{_shown(figures['ratio_to_suffix_chain'], figures['standard_error'] or np.nan, 3)} | "
                  f"{figures['calls_accepting_a_draft']:.2f} |")
        record.write(output, {**result, "temperature": args.temperature, "max_new_tokens": args.max_new_tokens,
                              "turns": args.turns, "samples": args.samples, "suffix_trees": SUFFIX_TREES,
                              "depth": DEPTH, "texts": str(args.texts)})
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
                "workload": args.workload, "turns": args.turns, "samples": args.samples, "suffix_tree": SUFFIX_TREE,
                "depth": DEPTH}
    done = {(result["conversation"], result["turn"], result["method"]): result
            for result in record.results(args.output)}
    lines = record.Lines(args.output)
    answers = lambda *key: done[(*key, "plain")]["tokens"]  # noqa: E731
    for unit, (cluster, turn, prompt_ids) in enumerate(workload(args, pair, answers)):
        labels = list(runners)
        labels = ["plain"] + [label for label in labels[unit % len(labels):] + labels[: unit % len(labels)]
                              if label != "plain"]  # plain first: its answer is the next turn's
        for label in labels:
            key = (cluster, turn, label)
            if key not in done:
                started = time.perf_counter()
                tokens, stats = runners[label](prompt_ids, args.seed + unit, args.max_new_tokens)
                done[key] = {"conversation": cluster, "turn": turn, "method": label,
                             "prompt_tokens": len(prompt_ids), "new_tokens": len(tokens),
                             **({"tokens": tokens} if label == "plain" else {}),  # the next turn quotes plain's
                             "seconds": time.perf_counter() - started, **stats, **settings}
                lines.append(done[key])
                print(f"{cluster} {turn} {label}: {len(tokens)} tokens, "
                      f"{len(tokens) / max(done[key]['target_calls'], 1):.2f}/call", file=sys.stderr)
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


def _shown(value: float, error: float, digits: int = 2) -> str:
    return f"{value:.{digits}f} ± {error:.{digits}f}" if np.isfinite(error) else f"{value:.{digits}f}"


if __name__ == "__main__":
    sys.exit(main())
