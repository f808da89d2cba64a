"""A draft with another tokenizer (TLI, ``engine.vocabulary``) against the same-tokenizer draft,
both drafting for the embedded target (Qwen2.5-Coder-1.5B-Instruct, Q4_K_M) on llama.cpp's
kernels: SmolLM2-135M-Instruct (``smollm2``, 49,152 tokens, restricted to those it shares with
the target's 151,936) and Qwen2.5-Coder-0.5B-Instruct (``default-draft``, the target's
tokenizer), beside plain decoding.

**Decoders**, interleaved prompt by prompt in a rotating order (drift hits all alike):
``plain`` (autoregressive), ``smollm2`` and ``0.5B``, each drafting with ``--method``
(default a chain of 3). Every decoder records at every verified position the verifier's exact
acceptance, α* for the same drafts and the bound p(shared) (``engine.optimum``; 1 for the
same-tokenizer draft), so their cost is in every drafting decoder's time alike.

**Figures**, per decoder over all prompts: the measured acceptance (accepted verifications
over verifications), the means of the exact acceptance, α* and p(shared) over the verified
positions, tokens per target call (prefill excluded: does not depend on the machine's load)
and tokens/s end to end (prefill included: noisy where the machine is shared). Ratios to
plain decoding and between the drafts are of totals, with a standard error by the delta
method over prompts. One JSON line per (round, prompt, decoder) goes to ``--output`` after the
run's envelope (``benchmarks.record``); a rerun with the same ``--output`` skips what is there;
the summary of the whole file goes beside it (``.json``).

    python -m benchmarks.drafting.bench_tli --limit 4 --max-new-tokens 64 --threads 2
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict

import numpy as np
import torch

from benchmarks import record
from specbound.datasets import load_prompts
from specbound.engine import Processing, build_method
from specbound.engine.assembly import assemble
from specbound.models.pair import load_pair

TARGET = "default-target"
DRAFTS = {"smollm2": "smollm2", "0.5B": "default-draft"}  # label -> embedded model


def decoders(args) -> dict:
    """Each decoder's (pair, assembly), the target loaded once per pair (llama.cpp maps the
    file: its weights are shared)."""
    options = dict(option.split("=", 1) for option in args.options)
    method = build_method(args.method, **{name: int(value) if value.isdigit() else value
                                          for name, value in options.items()})
    built = {}
    for label, draft in {"plain": None, **DRAFTS}.items():
        pair = load_pair(TARGET, draft, backend="llama.cpp", threads=args.threads, progress=False)
        processing = Processing(args.temperature, args.top_k, vocab_size=pair.vocab_size)
        schedule = build_method("autoregressive") if draft is None else method
        built[label] = (pair, assemble(pair, processing, schedule, optimum_budget=float("inf")))
    return built


def run_one(pair, assembly, prompt_text: str, max_new_tokens: int, seed: int) -> dict:
    ids = pair.encode(prompt_text)
    started = time.perf_counter()
    generation = assembly.decoder.generate(ids, assembly.schedule, max_new_tokens, torch.Generator().manual_seed(seed))
    seconds = time.perf_counter() - started
    stats, optimum = generation.stats, generation.stats.optimum
    return {"tokens": stats.tokens_generated, "target_calls": stats.target_calls, "seconds": seconds,
            "verifications": sum(stats.attempts_by_position), "accepted": sum(stats.accepts_by_position),
            "exact": optimum.acceptances, "optimum": optimum.optima, "bound": optimum.bounds}


def summary(rows: list[dict]) -> dict:
    """Per decoder: totals, the position means, and ratios with delta-method standard errors
    over prompts."""
    by = defaultdict(list)
    for row in rows:
        by[row["decoder"]].append(row)
    table = {}
    for label, runs in by.items():
        positions = {key: [value for run in runs for value in run[key]] for key in ("exact", "optimum", "bound")}
        verifications = sum(run["verifications"] for run in runs)
        table[label] = {
            "runs": len(runs), "tokens": sum(run["tokens"] for run in runs),
            "acceptance": sum(run["accepted"] for run in runs) / verifications if verifications else None,
            **{f"mean_{key}": float(np.mean(values)) if values else None for key, values in positions.items()},
            "positions": len(positions["exact"]),
            "bound_holds_everywhere": all(bound + 1e-6 >= best >= exact - 1e-6 for exact, best, bound
                                          in zip(positions["exact"], positions["optimum"], positions["bound"])),
            "tokens_per_target_call": ratio_of_totals(runs, "tokens", "target_calls"),
            "tokens_per_second": ratio_of_totals(runs, "tokens", "seconds"),
        }
    return {"decoders": table, "speed_ratios": {f"{a} / {b}": paired_ratio(by[a], by[b]) for a, b in
                                                (("smollm2", "plain"), ("0.5B", "plain"), ("smollm2", "0.5B"))
                                                if a in by and b in by}}


def ratio_of_totals(runs, numerator: str, denominator: str) -> dict:
    """Σ numerator / Σ denominator over runs, its standard error by the delta method."""
    x = np.array([run[numerator] for run in runs], float)
    y = np.array([run[denominator] for run in runs], float)
    value = x.sum() / y.sum()
    error = float(np.sqrt(np.sum((x - value * y) ** 2)) / y.sum()) if len(runs) > 1 else None
    return {"value": float(value), "standard_error": error}


def paired_ratio(first: list[dict], second: list[dict]) -> dict:
    """Tokens/s of ``first`` over ``second`` from their totals, paired by (round, prompt):
    (Σ t1/Σ s1) / (Σ t2/Σ s2), its standard error by the delta method over the pairs."""
    keyed = {(run["round"], run["prompt"]): run for run in second}
    pairs = [(run, keyed[(run["round"], run["prompt"])]) for run in first if (run["round"], run["prompt"]) in keyed]
    t1, s1, t2, s2 = (np.array([pair[side][key] for pair in pairs], float)
                      for side, key in ((0, "tokens"), (0, "seconds"), (1, "tokens"), (1, "seconds")))
    value = (t1.sum() / s1.sum()) / (t2.sum() / s2.sum())
    if len(pairs) < 2:
        return {"value": float(value), "standard_error": None, "pairs": len(pairs)}
    gradient = np.stack([1 / t1.sum(), -1 / s1.sum(), -1 / t2.sum(), 1 / s2.sum()]) * value  # d value / d totals
    residuals = np.stack([t1 - t1.mean(), s1 - s1.mean(), t2 - t2.mean(), s2 - s2.mean()])
    variance = len(pairs) * float(gradient @ np.cov(residuals) @ gradient)
    return {"value": float(value), "standard_error": float(np.sqrt(max(variance, 0.0))), "pairs": len(pairs)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", default="instructions")
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--method", default="chain")
    parser.add_argument("--options", nargs="*", default=["gamma=3"], help="the method's options, name=value")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-k", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    record.add_output(parser, "drafting/tli.jsonl")
    args = parser.parse_args(argv)
    prompts = load_prompts(args.prompts, limit=args.limit)
    done = {(row["round"], row["prompt"], row["decoder"]) for row in record.results(args.output)}
    built = decoders(args)
    lines = record.Lines(args.output)
    labels = list(built)
    for round_index in range(args.rounds):
        for index, prompt in enumerate(prompts):
            shift = (round_index * len(prompts) + index) % len(labels)
            for label in labels[shift:] + labels[:shift]:  # a rotating order
                if (round_index, prompt.id, label) in done:
                    continue
                pair, assembly = built[label]
                row = run_one(pair, assembly, prompt.text, args.max_new_tokens, seed=round_index * 1000 + index)
                row = {"round": round_index, "prompt": prompt.id, "decoder": label,
                       "settings": {"method": args.method, "options": args.options, "temperature": args.temperature,
                                    "top_k": args.top_k, "max_new_tokens": args.max_new_tokens,
                                    "threads": args.threads, "backend": "llama.cpp",
                                    "shared_tokens": None if pair.vocabulary is None
                                    else len(pair.vocabulary.target_ids)},
                       **row}
                lines.append(row)
                print(f"round {round_index} {prompt.id} {label}: {row['tokens']} tokens, "
                      f"{row['tokens'] / row['target_calls']:.2f}/call, {row['tokens'] / row['seconds']:.2f}/s",
                      file=sys.stderr)
    rows = list(record.results(args.output))
    result = summary(rows)
    record.write(args.output.with_suffix(".json"), result)
    for label, figures in result["decoders"].items():
        print(label, {key: (round(value, 4) if isinstance(value, float) else value) for key, value in figures.items()})
    for name, figures in result["speed_ratios"].items():
        print(f"tokens/s {name}: {figures}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
