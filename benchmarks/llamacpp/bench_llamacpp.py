"""Our engine on llama.cpp's kernels against llama.cpp itself, side by side on the same GGUF files.

One run, interleaved prompt by prompt so that load drift hits every decoder alike, the same
prompt ids (our chat template), T = 0.7 with no top-k/top-p/min-p, the same threads, each
decoder stopping at the pair's EOS ids or ``--max-new-tokens``:
- ``llama.cpp plain``: llama-cpp-python's ``Llama.generate`` (its own sampling loop);
- ``llama.cpp draft-4``: the same with the 0.5B draft drafting 4 tokens greedily (a
  ``LlamaDraftModel``; llama.cpp verifies by sampling the target and matching the drafts);
- ``llama.cpp lookup``: with ``LlamaPromptLookupDecoding`` (its defaults);
- ours on the llama.cpp backend: autoregressive, ``auto`` (the planner, learning across the
  prompts as a server would) and a prompt-lookup chain;
- with ``--torch``: ours autoregressive and ``auto`` on the torch backend (bf16), for
  reference.
Tokens/s is end to end (prefill included), summed over the prompts. One JSON line per
(prompt, decoder) goes to --output as soon as it finishes, after the run's envelope
(``benchmarks.record``); rerunning with the same --output skips what is there; the table
printed at the end (``report``) reads the whole file.

    python -m benchmarks.llamacpp.bench_llamacpp --prompts humaneval --limit 8 --max-new-tokens 128 --threads 2
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from benchmarks import record
from benchmarks.engine.bench_engine import run_interleaved
from specbound.datasets import load_prompts
from specbound.engine import Decoder, Processing, PromptLookupDrafter, build_method
from specbound.engine.assembly import assemble
from specbound.engine.backends.llamacpp import LlamaCppLM
from specbound.engine.planner import Planner
from specbound.models.loading import gguf_file
from specbound.models.pair import load_pair

CONTEXT = 2048  # llama.cpp's context for its own runs (every prompt + new tokens fits)


class GreedyDraft:
    """A ``LlamaDraftModel``: ``count`` tokens drafted greedily by a second ``Llama``, which
    keeps its cache across calls by prefix matching (``Llama.generate``)."""

    def __init__(self, llama, count: int = 4):
        self.llama, self.count = llama, count

    def __call__(self, input_ids, **kwargs):
        drafted = []
        for token in self.llama.generate(list(map(int, input_ids)), top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                         repeat_penalty=1.0):
            drafted.append(token)
            if len(drafted) == self.count:
                break
        return np.array(drafted, dtype=np.intc)


def llama_runner(llama, temperature: float, stop_ids):
    """llama-cpp-python's own generation loop on ``llama``, pure sampling at ``temperature``;
    its target forwards counted at ``eval``. The prompt's eval counts: it gives the first token,
    as our first decoding call does (ours prefills all but the prompt's last token), so plain
    decoding is one token a call in both."""
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
        return tokens, {"target_calls": calls[0]}

    return run


def engine_runner(decoder, method):
    def run(prompt_ids, seed, max_new_tokens):
        planned = method.plans_made
        generation = decoder.generate(prompt_ids, method, max_new_tokens, torch.Generator().manual_seed(seed))
        stats = generation.stats.to_dict()
        if isinstance(method, Planner):  # the plans of this generation (of the latest kept), predicted tokens/s
            made = min(method.plans_made - planned, len(method.history))
            kept = method.history[len(method.history) - made:]
            stats["plans"] = [f"{label} ({speed:.1f})" for _, label, speed in kept]
        return generation.tokens, stats

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="default-target")
    parser.add_argument("--draft", default="default-draft")
    parser.add_argument("--prompts", default="humaneval")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of every decoder")
    parser.add_argument("--torch", action="store_true", help="add ours on the torch backend (bf16) for reference")
    parser.add_argument("--only", default=None, help="comma-separated decoder labels to run (default all)")
    record.add_output(parser, "llamacpp/bench_llamacpp.jsonl")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    pair = load_pair(args.target, args.draft, backend="llama.cpp", progress=False, threads=args.threads)
    processing = Processing(args.temperature, vocab_size=pair.vocab_size)
    stop_ids = set(pair.eos_token_ids)
    target_path, _ = gguf_file(args.target, progress=False)
    draft_path, _ = gguf_file(args.draft, progress=False)
    common = dict(n_ctx=CONTEXT, n_batch=512, n_threads=args.threads, n_threads_batch=args.threads,
                  flash_attn=True, verbose=False)
    # With a draft model Llama keeps every row's logits, but sizes that buffer by n_batch unless
    # logits_all is asked for: past 512 tokens its eval fails (llama-cpp-python 0.3.36).
    speculative = dict(common, logits_all=True)
    runners = {
        "llama.cpp plain": lambda: llama_runner(Llama(str(target_path), **common), args.temperature, stop_ids),
        "llama.cpp draft-4": lambda: llama_runner(
            Llama(str(target_path), draft_model=GreedyDraft(Llama(str(draft_path), **common)), **speculative),
            args.temperature, stop_ids),
        "llama.cpp lookup": lambda: llama_runner(
            Llama(str(target_path), draft_model=LlamaPromptLookupDecoding(), **speculative), args.temperature,
            stop_ids),
        "ours plain (llama.cpp)": lambda: engine_runner(*assemble(pair, processing, build_method("autoregressive"))),
        "ours auto (llama.cpp)": lambda: engine_runner(*assemble(pair, processing)),
        "ours lookup γ=4 (llama.cpp)": lambda: engine_runner(
            Decoder(LlamaCppLM(pair.target), PromptLookupDrafter(pair.vocab_size), processing, pair.eos_token_ids),
            build_method("chain", gamma=4)),
    }
    if args.torch:
        torch_pair = load_pair(args.target, args.draft, float32_twins=False, progress=False)
        runners["ours plain (torch bf16)"] = lambda: engine_runner(*assemble(torch_pair, processing,
                                                                             build_method("autoregressive")))
        runners["ours auto (torch bf16)"] = lambda: engine_runner(*assemble(torch_pair, processing))
    if args.only:
        wanted = [label.strip() for label in args.only.split(",")]
        runners = {label: make for label, make in runners.items() if label in wanted}
    runners = {label: make() for label, make in runners.items()}

    prompts = load_prompts(args.prompts, limit=args.limit)
    encoded = [pair.encode(prompt.text) for prompt in prompts]
    settings = {"threads": args.threads, "temperature": args.temperature, "max_new_tokens": args.max_new_tokens,
                "prompts": args.prompts}
    run_interleaved(prompts, encoded, runners, args.output, settings, args.seed, args.max_new_tokens)
    report(args.output)
    return 0


def report(path: Path) -> None:
    """Tokens/s per decoder over the prompts, its ratio to llama.cpp's plain loop and to its
    best own speculative mode, and tokens per target call for ours."""
    tokens, seconds, calls, labels = defaultdict(int), defaultdict(float), defaultdict(int), []
    for result in record.results(path):
        label = result["method"]
        if label not in labels:
            labels.append(label)
        tokens[label] += result["new_tokens"]
        seconds[label] += result["seconds"]
        calls[label] += (result["stats"] or {}).get("target_calls", 0)
    speed = {label: tokens[label] / seconds[label] for label in labels if seconds[label]}
    plain = speed.get("llama.cpp plain")
    best_own = max([speed[label] for label in ("llama.cpp draft-4", "llama.cpp lookup") if label in speed] or [0.0])
    print("| decoder | tokens | tokens/s | × llama.cpp plain | × llama.cpp best speculative | tokens/target call |")
    print("|---|---|---|---|---|---|")
    for label in labels:
        ratio = lambda base: f"{speed[label] / base:.2f}" if base else "—"  # noqa: E731
        per_call = f"{tokens[label] / calls[label]:.2f}" if calls[label] else ""
        print(f"| {label} | {tokens[label]} | {speed[label]:.2f} | {ratio(plain)} | {ratio(best_own)} | {per_call} |")


if __name__ == "__main__":
    sys.exit(main())
