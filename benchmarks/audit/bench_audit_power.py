"""Catching the reproduced transformers q bug on the embedded pair in minutes: an audit whose
design — where to look — is fixed before any audited sample is drawn.

The engine is transformers' assisted generation with the assistant's raw logits handed over as
q (``bench_audit.RawLogitsAssistant``, the bug of transformers#47932) at top-k 50, on the
embedded pair in bf16 on torch, as ``bench_audit``'s transformers section runs it;
``--engines correct`` audits the same generation without the bug (no false alarm expected).
The audit is ``specbound.audit.audit`` as it is, tolerances measured on the reference. What is
chosen is what it is given, from ``bench_audit_bias``'s exact figures on continuations the
target sampled alone (``results/audit/bias_temperatures_mt_bench.json``):

- the temperature, 1.6: a bug in how the processed laws enter the ratio (here q̃ =
  softmax(raw logits), the temperature-1 law without top-k) moves the emitted law by an amount
  that grows with |1/T − 1|, and the sharpness test's evidence at a row grows with the row's
  spread σ² (the score moves by about ε·σ², its noise is σ). Below 1 the rows grow sure; above
  1 they spread: at T = 1.6 the median audit needs about 340 positions with bf16's measured
  tolerances, against 5,800 at T = 0.7 (280 and 2,900 with float32's);
- the prompts: the four of the pilot's sixteen MT-Bench prompts with the largest σ² per
  position at that temperature (``--prompt-indices``);
- fewer samples, longer continuations (8 × 96 tokens): each sample prefills its prompt again,
  and the pilot's per-position figures are flat over the 48 positions it saw.

The false-alarm guarantee is the auditor's own: its three tests hold at the level for any
prompts, temperature, lengths and sample count fixed independently of the engine's samples,
and these were fixed from the target alone before the audit ran. The record holds each
audit's verdict, p-values, measured tolerances, seconds (sampling, scoring, measuring), the
process's CPU seconds and the load average before and after (the machine may be shared: CPU
seconds divided by the threads is about what the run takes alone).

    python -m benchmarks.audit.bench_audit_power --engines buggy
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import torch

from benchmarks import record
from benchmarks.audit.bench_audit import RawLogitsAssistant
from specbound.audit import audit
from specbound.audit.samplers import transformers_sampler
from specbound.datasets import load_prompts
from specbound.models.pair import load_pair

ENGINES = ("buggy", "correct")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="default-target")
    parser.add_argument("--draft", default="default-draft")
    parser.add_argument("--prompts", default="mt_bench")
    parser.add_argument("--prompt-indices", default="7,3,15,10", help="the prompts of the set audited, chosen in advance")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=1.6)
    parser.add_argument("--top-k", type=int, default=50)
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--level", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--engines", default="buggy", help=f"comma-separated, of {', '.join(ENGINES)}")
    record.add_output(parser, "audit/power_transformers.json")
    args = parser.parse_args()
    engines = args.engines.split(",")
    if set(engines) - set(ENGINES):
        parser.error(f"--engines: choose from {', '.join(ENGINES)}; got {args.engines!r}")
    torch.set_num_threads(args.threads)
    pair = load_pair(args.target, args.draft, getattr(torch, args.dtype), progress=False, float32_twins=False,
                     backend="torch")
    texts = load_prompts(args.prompts)
    prompts = [pair.encode(texts[int(index)].text) for index in args.prompt_indices.split(",")]
    audits = [audited(args, engine, pair, prompts) for engine in engines]
    record.write(args.output, {"settings": vars(args), "prompt_tokens": [len(ids) for ids in prompts],
                               "audits": audits})
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


def audited(args, engine: str, pair, prompts) -> dict:
    """One audit of ``engine`` (``buggy``: raw logits as q; ``correct``: as transformers wrote it)."""
    draft = RawLogitsAssistant(pair.draft) if engine == "buggy" else pair.draft
    sampler = transformers_sampler(pair.target, args.temperature, top_k=args.top_k, assistant_model=draft,
                                   eos_token_ids=pair.eos_token_ids)
    load_before, cpu_before, started = os.getloadavg(), _cpu_seconds(), time.perf_counter()
    def progress(index, sample):
        if (index + 1) % max(1, args.samples // 8) == 0:  # about eight lines an audit
            print(f"{engine}: {index + 1}/{args.samples} samples, {time.perf_counter() - started:.0f} s",
                  file=sys.stderr)

    result = audit(sampler, pair.target, prompts, temperature=args.temperature, top_k=args.top_k,
                   max_new_tokens=args.max_new_tokens, samples=args.samples, seed=args.seed, level=args.level,
                   vocab_size=pair.vocab_size, on_sample=progress)
    summary = {"engine": engine, **result.to_dict(), "wall_seconds": time.perf_counter() - started,
               "cpu_seconds": _cpu_seconds() - cpu_before, "load_average_before": load_before,
               "load_average_after": os.getloadavg()}
    print(json.dumps(summary), file=sys.stderr)
    return summary


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    sys.exit(main())
