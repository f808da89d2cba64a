"""The zoo of published speculative-decoding bugs (``specbound.audit.zoo``): per case, the exact
TV it causes, the auditor's verdict, and what catching it at level 1e-3 takes on this machine.

Sections (``--sections``, both by default), one record (``benchmarks.record``):

- ``tiny``: the zoo tests' pair (``zoo.tiny_zoo``: tiny float32 GGUF models on llama.cpp,
  vocabulary 8, T 0.9, top-k 4, three prompts; min_p 0.1 and a logit bias of 0.5 on token 3
  for SGLang #10617's case): per case the exact first-token TV at each prompt
  (``zoo.first_token_tv``), the verdict at 3,000 samples x 4 tokens, and the first sample
  count of a doubling grid (25, 50, ...) at which the audit (seed 0, a fresh reference) fails,
  with its wall seconds — for a bias no size up to ``--max-samples`` catches, the count
  ``audit.samples_to_detect`` states for its largest TV.
- ``embedded``: the embedded pair. A calibration audit of our chain γ=3 on llama.cpp
  (``--calibration-samples`` x ``--max-new-tokens``) gives the verdict, the tolerances
  measured on the Q4_K_M target and the seconds per sample. Then, along continuations the
  target samples (torch, float32: DeepSpec's bf16 rounding of the logits is then the bug
  itself), at every position each case's law of a step's first token there
  (``zoo.first_token_law`` on the pair's rows; min_p ``--min-p`` for SGLang #10617), and per
  case the mean TV, the mean pooled shift (the largest |F_out − F_p| over the target's
  ranking) and the sharpness drift; from them, at the calibration's tolerances, the samples
  of ``--max-new-tokens`` tokens at which the median audit rejects: the pooled test's as if
  every position's shift lay across one common edge (a lower bound), the sharpness test's
  where its expected statistic crosses the threshold; minutes at the calibration's rate.

    python -m benchmarks.audit.bench_audit_zoo --sections tiny
    python -m benchmarks.audit.bench_audit_zoo --sections embedded --limit 8 --max-new-tokens 16
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time

import numpy as np
import torch

from benchmarks import record
from specbound.audit import audit
from specbound.audit.auditor import samples_to_detect, strict_json
from specbound.audit.pit import FLOOR, detectable_shift, sharpness_test
from specbound.audit.reference import Reference
from specbound.audit.zoo import (CASES, TINY_PROCESSORS, TINY_TEMPERATURE, TINY_TOP_K, TINY_VOCAB, Processors,
                                 first_token_law, first_token_tv, tiny_zoo, zoo_sampler)
from specbound.engine import Processing

SECTIONS = ("tiny", "embedded")
LEVEL = 1e-3
TINY_SAMPLES, TINY_TOKENS = 3000, 4


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--max-samples", type=int, default=12800, help="the tiny section's largest audit")
    parser.add_argument("--target", default="default-target")
    parser.add_argument("--draft", default="default-draft")
    parser.add_argument("--prompts", default="instructions")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-k", type=int, default=50)
    parser.add_argument("--min-p", type=float, default=0.1)
    parser.add_argument("--calibration-samples", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    record.add_output(parser, "audit/zoo.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = {"settings": {key: value for key, value in vars(args).items() if key != "output"}}
    sections = args.sections.split(",")
    if "tiny" in sections:
        result["tiny"] = run_tiny(args)
    if "embedded" in sections:
        result["embedded"] = run_embedded(args)
    print(json.dumps(result, indent=1, default=str))
    record.write(args.output, result)
    return 0


# -- the tiny pair ------------------------------------------------------------------------------

def run_tiny(args) -> dict:
    zoo = tiny_zoo(tempfile.mkdtemp(), TINY_TOKENS)
    cases = []
    for case, (instance, lossless) in CASES.items():
        laws, reference = zoo.of(case)

        def audited(samples: int):
            started = time.perf_counter()  # a fresh reference: none of the rows another audit scored is kept
            result = audit(zoo_sampler(case, laws), Reference(reference.language_model), zoo.prompts,
                           temperature=TINY_TEMPERATURE, top_k=TINY_TOP_K, max_new_tokens=TINY_TOKENS,
                           samples=samples, seed=0, level=LEVEL)
            return result, time.perf_counter() - started

        tvs = [first_token_tv(case, laws, prompt) for prompt in zoo.prompts]
        result, seconds = audited(TINY_SAMPLES)
        entry = {"case": case, "instance": instance, "lossless": lossless, "first_token_tv": tvs,
                 "verdict": result.verdict, "p_value": result.p_value, "detectable_tv": result.detectable_tv,
                 "tolerance": result.tolerance, "rounding": strict_json(result.rounding), "seconds": seconds}
        if not lossless:
            entry.update(caught_at(audited, args.max_samples, max(tvs), result.tolerance))
        print(json.dumps(entry), file=sys.stderr)
        cases.append(entry)
    return {"settings": {"backend": zoo.backend, "vocab": TINY_VOCAB, "temperature": TINY_TEMPERATURE,
                         "top_k": TINY_TOP_K, "samples": TINY_SAMPLES, "tokens": TINY_TOKENS, "level": LEVEL,
                         "prompts": zoo.prompts, "processors": vars(TINY_PROCESSORS)},
            "cases": cases}


def caught_at(audited, largest: int, tv: float, tolerance: float) -> dict:
    """The first sample count of the doubling grid from 25 at which the audit fails, with its
    seconds; else the count ``samples_to_detect`` states for ``tv``."""
    samples = 25
    while samples <= largest:
        result, seconds = audited(samples)
        if result.verdict == "failed":
            return {"caught_at_samples": samples, "caught_seconds": seconds}
        samples *= 2
    return {"caught_at_samples": None,
            "samples_to_detect": samples_to_detect(tv, TINY_TOKENS, TINY_TOKENS, tolerance, LEVEL)}


# -- the embedded pair --------------------------------------------------------------------------

class RowLaws:
    """``laws(position, kind)`` over one continuation's rows of each kind (``zoo.Laws.KINDS``)."""

    def __init__(self, rows: dict[str, torch.Tensor]):
        self.rows = {kind: values.double().numpy() for kind, values in rows.items()}

    def __call__(self, position: int, kind: str = "target") -> np.ndarray:
        row = self.rows[kind][position]
        return row / row.sum()


def run_embedded(args) -> dict:
    calibration = calibrate(args)
    figures = position_figures(args)
    return {"calibration": calibration, "positions": int(figures["speculative"]["tv"].size),
            "cases": [case_summary(case, figures[case], calibration, args) for case in CASES]}


def calibrate(args) -> dict:
    """Our chain γ=3 on llama.cpp audited: verdict, measured tolerances, seconds per sample."""
    from specbound.api import Speculator
    from specbound.audit.reference import pair_reference
    from specbound.audit.samplers import engine_sampler
    from specbound.datasets import load_prompts
    from specbound.engine import Sampling
    from specbound.models.pair import load_pair

    pair = load_pair(args.target, args.draft, progress=False, backend="llama.cpp", threads=args.threads)
    speculator = Speculator(pair=pair, progress=False)
    decoder, method = speculator.decoder_for(Sampling(args.temperature, args.top_k), "chain", {"gamma": 3})
    prompts = [pair.encode(prompt.text) for prompt in load_prompts(args.prompts, limit=args.limit)]
    started = time.perf_counter()
    result = audit(engine_sampler(decoder, method), pair_reference(pair), prompts, temperature=args.temperature,
                   top_k=args.top_k, max_new_tokens=args.max_new_tokens, samples=args.calibration_samples, seed=0,
                   level=LEVEL, vocab_size=pair.vocab_size)
    seconds = time.perf_counter() - started
    summary = {"engine": "specbound chain gamma=3 on llama.cpp", **result.to_dict(), "total_seconds": seconds,
               "seconds_per_sample": seconds / args.calibration_samples}
    print(json.dumps(summary), file=sys.stderr)
    del speculator, decoder, pair
    return summary


def position_figures(args) -> dict[str, dict[str, np.ndarray]]:
    """Per case and position: TV, pooled shift, drift, σ, σ² (module docstring)."""
    from specbound.datasets import load_prompts
    from specbound.models.pair import load_pair

    pair = load_pair(args.target, args.draft, torch.float32, progress=False, backend="torch")
    processing = Processing(args.temperature, args.top_k or None, None, pair.vocab_size)
    raw = Processing(1.0, vocab_size=pair.vocab_size)
    processors = Processors(args.temperature, min_p=args.min_p)
    figures = {case: {key: [] for key in ("tv", "shift", "drift", "spread", "variance")} for case in CASES}
    for index, prompt in enumerate(load_prompts(args.prompts, limit=args.limit)):
        ids = torch.tensor([pair.encode(prompt.text)])
        torch.manual_seed(index)
        with torch.no_grad():
            full = pair.target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                                        do_sample=True, temperature=args.temperature, top_k=args.top_k or None)
            span = slice(ids.shape[1] - 1, full.shape[1] - 1)
            target = pair.target(full).logits[0, span, : pair.vocab_size].float()
            draft = pair.draft(full).logits[0, span, : pair.vocab_size].float()
        laws = RowLaws({"target": processing.probs(processors(target)), "target_plain": processing.probs(target),
                        "draft": processing.probs(draft), "draft_raw": raw.probs(draft),
                        "draft_bf16": processing.probs(draft.bfloat16().float())})
        for position in range(target.shape[0]):
            reference = laws(position)
            order = np.argsort(-reference, kind="stable")
            scores = np.log(np.maximum(reference, FLOOR))
            centred = scores - reference @ scores
            variance = float(reference @ centred**2)
            for case in CASES:
                law = first_token_law(case, laws, position)
                law = law / law.sum()
                shift = np.abs(np.cumsum(law[order]) - np.cumsum(reference[order])).max()
                for key, value in (("tv", 0.5 * np.abs(law - reference).sum()), ("shift", shift),
                                   ("drift", law @ centred), ("spread", math.sqrt(variance)),
                                   ("variance", variance)):
                    figures[case][key].append(float(value))
        print(f"prompt {index + 1}/{args.limit}: {target.shape[0]} positions", file=sys.stderr)
    return {case: {key: np.array(values) for key, values in entries.items()} for case, entries in figures.items()}


def case_summary(case: str, figures: dict, calibration: dict, args) -> dict:
    """The case's mean figures and the samples (and minutes) the median audit needs (module docstring)."""
    n = figures["tv"].size
    drift, spread, variance = (float(figures[key].sum()) for key in ("drift", "spread", "variance"))
    shift = float(figures["shift"].mean())
    tolerance = calibration["tolerance"]

    def pooled_caught(positions: int) -> bool:
        return detectable_shift(positions, tolerance, LEVEL / 3, power=0.5) <= shift

    def sharpness_caught(positions: int) -> bool:
        scale = positions / n
        return sharpness_test(drift * scale, spread * scale, variance * scale, calibration["sharpness_tolerance"],
                              calibration["variance_tolerance"]).p_value <= LEVEL / 3

    needed = {name: least_positions(caught) for name, caught in (("pooled", pooled_caught),
                                                                 ("sharpness", sharpness_caught))}
    best = min((value for value in needed.values() if value is not None), default=None)
    samples = None if best is None else math.ceil(best / args.max_new_tokens)
    entry = {"case": case, "instance": CASES[case][0], "lossless": CASES[case][1],
             "tv_mean": float(figures["tv"].mean()), "tv_max": float(figures["tv"].max()), "shift_mean": shift,
             "sharpening": drift / variance,
             "positions_needed": needed, "samples_needed": samples,
             "minutes_needed": None if samples is None else samples * calibration["seconds_per_sample"] / 60}
    print(json.dumps(entry), file=sys.stderr)
    return entry


def least_positions(caught, ceiling: int = 10**12) -> int | None:
    """The least position count at which ``caught`` holds (doubling, then bisection; None past
    ``ceiling``)."""
    high = 16
    while not caught(high):
        high *= 2
        if high > ceiling:
            return None
    low = high // 2
    while high - low > max(1, high // 100):
        middle = (low + high) // 2
        low, high = (low, middle) if caught(middle) else (middle, high)
    return high


if __name__ == "__main__":
    sys.exit(main())
