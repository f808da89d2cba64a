"""How far a correct engine's rows are from the auditor's reference rows by rounding alone,
on each backend: the figures ``audit.tolerances`` rests on.

The auditor scores a sampled continuation by teacher forcing — the prompt prefilled alone,
then one forward over the continuation (``audit.reference``); an engine computes the same
rows in other batch shapes: one row at a time (plain decoding) or k rows at a time (a chain
of drafts verified). For prompts of a built-in set this samples a continuation by plain
decoding and computes its rows the three ways; per row, against the reference's row, at
temperature T (top-k as given; 0: off):

- ``tv``: the total variation between the two next-token laws;
- ``top``: |p'(x*) − p(x*)|, x* the reference's most likely token, and ``eta`` = 1 − p(x*),
  the mass outside it: logit errors spread over s move that mass by a factor within
  [e^−s, e^s], so ``top`` / ``eta`` says how rounding scales with a row's own uncertainty.

- the sharpness test's score f = log max(p, ``audit.pit.FLOOR``) of the reference's row p:
  ``score_drift`` = Σ|E'[f] − E[f]| / Σσ and ``score_variance`` = Σ E'[(f − E[f])²] / Σσ² − 1,
  E' under the engine's row, σ² = Var_p(f).

Writes one record (``benchmarks.record``) with an entry per backend and top-k: max and mean
of ``tv``, ``score_drift`` and ``score_variance`` (what ``engine.backends.Rounding`` states,
with a margin), Σ top / Σ eta, the largest ``top / eta`` and its quantiles.

    python -m benchmarks.audit.bench_audit_rounding --limit 16 --max-new-tokens 32 --threads 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from benchmarks import record
from specbound.audit.pit import FLOOR
from specbound.datasets import load_prompts
from specbound.engine import Processing
from specbound.engine.backends import Entries
from specbound.models.pair import load_pair

SHAPES = ("one row", "4 rows")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="default-target")
    parser.add_argument("--prompts", default="instructions")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-k", default="0,50", help="comma-separated; 0: off")
    parser.add_argument("--backends", default="llama.cpp,torch")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    record.add_output(parser, "audit/rounding.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    top_ks = [int(value) for value in args.top_k.split(",")]
    entries = []
    for backend in args.backends.split(","):
        started = time.perf_counter()
        pair = load_pair(args.target, None, progress=False, backend=backend, threads=args.threads)
        lm = pair.backend.language_model(pair.target)
        texts = [prompt.text for prompt in load_prompts(args.prompts, limit=args.limit)]
        rows = {shape: [] for shape in SHAPES}  # (reference logits, engine logits) per row
        for index, text in enumerate(texts):
            prompt = pair.encode(text)
            generator = torch.Generator().manual_seed(args.seed + index)
            sampling = Processing(args.temperature, vocab_size=pair.vocab_size)
            alone, continuation = plain_rows(lm, prompt, args.max_new_tokens, sampling, generator)
            reference = reference_rows(lm, prompt, continuation)
            blocks = block_rows(lm, prompt, continuation, 4)
            rows["one row"] += list(zip(reference, alone))
            rows["4 rows"] += list(zip(reference, blocks))
            print(f"{backend}: prompt {index + 1}/{len(texts)}", file=sys.stderr)
        for top_k in top_ks:
            processing = Processing(args.temperature, top_k or None, None, pair.vocab_size)
            entry = {"backend": backend, "target": args.target, "top_k": top_k, "temperature": args.temperature,
                     "prompts": args.prompts, "limit": args.limit, "max_new_tokens": args.max_new_tokens,
                     "threads": args.threads}
            for shape, pairs in rows.items():
                entry[shape] = summary(processing, pairs)
            entry["seconds"] = time.perf_counter() - started
            entries.append(entry)
            print(json.dumps(entry), file=sys.stderr)
        del lm, pair
    record.write(args.output, {"settings": vars(args), "records": entries})
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


def plain_rows(lm, prompt: list[int], count: int, sampling: Processing, generator) -> tuple[list, list[int]]:
    """Plain decoding, one row per forward: the rows' logits and the sampled tokens."""
    lm.reset(1, cells=len(prompt) + count + 1)
    logits = lm.prefill(0, prompt)[-1].float()
    rows, tokens = [], []
    for _ in range(count):
        rows.append(logits)
        token = int(torch.multinomial(sampling.probs(logits[None])[0].float(), 1, generator=generator))
        tokens.append(token)
        logits = lm.score([Entries.chain([token])]).logits(0)[0].float()
        lm.commit([[0]])
    return rows, tokens


def reference_rows(lm, prompt: list[int], continuation: list[int]) -> list:
    """The auditor's way (``audit.reference``): the prompt alone, then one forward over the rest."""
    lm.reset(1, cells=len(prompt) + len(continuation) + 1)
    first = lm.prefill(0, prompt)[-1].float()
    rest = lm.score([Entries.chain(continuation[:-1])]).logits(0).float()
    lm.commit([[]])
    return [first] + list(rest)


def block_rows(lm, prompt: list[int], continuation: list[int], size: int) -> list:
    """The rows as a chain verifier computes them: ``size`` entries per forward."""
    lm.reset(1, cells=len(prompt) + len(continuation) + size + 1)
    rows = [lm.prefill(0, prompt)[-1].float()]
    for start in range(0, len(continuation) - 1, size):
        block = continuation[start: start + size]
        rows += list(lm.score([Entries.chain(block)]).logits(0).float())
        lm.commit([list(range(len(block)))])
    return rows[: len(continuation)]


def summary(processing: Processing, pairs: list) -> dict:
    reference = processing.probs(torch.stack([pair[0] for pair in pairs])).double()
    engine = processing.probs(torch.stack([pair[1] for pair in pairs])).double()
    tv = 0.5 * (engine - reference).abs().sum(dim=1)
    top_mass, top = reference.max(dim=1)
    eta = 1 - top_mass
    moved = (engine.gather(1, top[:, None])[:, 0] - top_mass).abs()
    uncertain = eta > 1e-9
    ratio = moved[uncertain] / eta[uncertain]
    scores = reference.clamp(min=FLOOR).log()
    centre = (reference * scores).sum(dim=1, keepdim=True)
    spread = (reference * (scores - centre) ** 2).sum(dim=1)
    drift = (engine * (scores - centre)).sum(dim=1)
    second = (engine * (scores - centre) ** 2).sum(dim=1)
    cuts = torch.tensor([0.5, 0.9, 0.99], dtype=torch.float64)
    quantiles = torch.quantile(ratio, cuts).tolist() if len(ratio) else []
    return {"rows": len(pairs), "tv_max": float(tv.max()), "tv_mean": float(tv.mean()),
            "top_over_eta_aggregate": float(moved.sum() / eta.sum()), "top_over_eta_max": float(ratio.max()),
            "top_over_eta_quantiles_50_90_99": quantiles, "eta_mean": float(eta.mean()),
            "moved_where_eta_zero": float(moved[~uncertain].max()) if (~uncertain).any() else 0.0,
            "score_drift": float(drift.abs().sum() / spread.sqrt().sum()),
            "score_drift_signed": float(drift.sum() / spread.sqrt().sum()),
            "score_variance": float(second.sum() / spread.sum() - 1)}


if __name__ == "__main__":
    sys.exit(main())
