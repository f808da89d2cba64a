"""How large the reproduced transformers q bug is on the embedded pair, computed exactly,
and how many sampled tokens each of the auditor's tests needs to catch it.

The bug (``bench_audit.RawLogitsAssistant``, transformers#47932's kind): drafts are drawn
from the draft's processed law q (temperature, top-k) but the ratio and the residual use
q̃ = softmax(raw logits). At a position whose target law is p, the token speculative
sampling emits then has the law

    out(x) = q(x)·min(1, p(x)/q̃(x)) + (1 − Σ_y q(y)·min(1, p(y)/q̃(y)))·residual(x),
    residual ∝ max(p − q̃, 0),

at every drafted position (a bonus token after a fully accepted block is drawn from p
itself, so a position's law lies between p and out: these figures bound the bias from above).
Along continuations the target samples (torch, bf16 as the audit runs it), per position:
TV(out, p); the pooled test's shift (the largest |F_out − F_p| over the target's ranking);
the sharpness test's drift E_out[X] with σ and σ² (``audit.pit``). From their sums it states
the temperature error the bug amounts to (ΣE_out[X] / Σσ²) and, for the pooled and sharpness
tests at level 0.001/3 with the torch backend's tolerances, the least number of sampled
positions at which the median audit rejects: for the sharpness test, where the expected
statistic crosses its threshold; for the pooled test at best, as if every position's shift
lay across one common edge (they do not: it needs more).

The tolerances are the torch backend's table unless given (``--tolerance``,
``--sharpness-tolerance``, ``--variance-tolerance``: what the auditor's measured tolerance is
expected to be on a ``--dtype`` reference). Per prompt it also records the sums the sharpness
test adds up (positions, ΣE_out[X], Σσ, Σσ², the target's sampling seconds), so the positions
any subset of the prompts needs can be computed from the record, and per position index the
mean σ² and drift (whether late positions carry as much as early ones); ``--temperatures``
computes all of it at other temperatures on the same continuations (sampled at
``--temperature``: an approximation of the paths the other temperatures would take). These are
the figures an audit's design — which prompts, how long a continuation, which temperature and
dtype — is chosen from before it runs.

    python -m benchmarks.audit.bench_audit_bias --prompts instructions --limit 8 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from benchmarks import record
from specbound.audit.pit import FLOOR, detectable_shift, sharpness_test
from specbound.datasets import load_prompts
from specbound.engine import Processing
from specbound.models.pair import load_pair


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="default-target")
    parser.add_argument("--draft", default="default-draft")
    parser.add_argument("--prompts", default="instructions")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-k", type=int, default=50)
    parser.add_argument("--level", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--temperatures", type=lambda text: [float(value) for value in text.split(",")], default=None,
                        help="temperatures at which the figures are computed on the continuations the target "
                        "sampled at --temperature (default: that one)")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--tolerance", type=float, default=None, help="default: the torch backend's table")
    parser.add_argument("--sharpness-tolerance", type=float, default=None)
    parser.add_argument("--variance-tolerance", type=float, default=None)
    record.add_output(parser, "audit/bias.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair(args.target, args.draft, getattr(torch, args.dtype), progress=False, float32_twins=False,
                     backend="torch")
    table = pair.backend.rounding
    tolerances = {"tolerance": table.mean_tv if args.tolerance is None else args.tolerance,
                  "score_drift": table.score_drift if args.sharpness_tolerance is None else args.sharpness_tolerance,
                  "score_variance": table.score_variance if args.variance_tolerance is None
                  else args.variance_tolerance}
    temperatures = [args.temperature] if args.temperatures is None else args.temperatures
    processings = {temperature: Processing(temperature, args.top_k or None, None, pair.vocab_size)
                   for temperature in temperatures}
    rows = {temperature: [] for temperature in temperatures}
    prompts = {temperature: [] for temperature in temperatures}
    for index, prompt in enumerate(load_prompts(args.prompts, limit=args.limit)):
        ids = torch.tensor([pair.encode(prompt.text)])
        torch.manual_seed(index)
        started = time.perf_counter()
        with torch.no_grad():
            full = pair.target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                                        do_sample=True, temperature=args.temperature, top_k=args.top_k or None)
            seconds = time.perf_counter() - started
            span = slice(ids.shape[1] - 1, full.shape[1] - 1)
            target_logits = pair.target(full).logits[0, span, : pair.vocab_size].float()
            draft_logits = pair.draft(full).logits[0, span, : pair.vocab_size].float()
        for temperature, processing in processings.items():
            rows[temperature].append(position_figures(processing, target_logits, draft_logits))
            figures = rows[temperature][-1]
            prompts[temperature].append({"prompt": index, "prompt_tokens": ids.shape[1],
                                         "positions": int(figures["tv"].numel()), "generate_seconds": seconds,
                                         **{key: float(figures[key].sum()) for key in ("tv", "drift", "spread",
                                                                                       "variance")}})
        print(json.dumps(prompts[args.temperature if args.temperature in prompts else temperatures[0]][-1]),
              file=sys.stderr)
    result = {"settings": vars(args), "tolerances": tolerances, "by_temperature": {}}
    for temperature in temperatures:
        figures = {key: torch.cat([row[key] for row in rows[temperature]]) for key in rows[temperature][0]}
        result["by_temperature"][str(temperature)] = {
            "positions": int(figures["tv"].numel()), **summary(figures, tolerances, args.level),
            "per_prompt": prompts[temperature], "by_position": by_position(rows[temperature])}
    print(json.dumps(result, indent=1, default=str))
    record.write(args.output, result)
    return 0


def position_figures(processing: Processing, target_logits: torch.Tensor, draft_logits: torch.Tensor) -> dict:
    """Per position: the bug's TV, the pooled shift, the sharpness drift, σ and σ² (module docstring)."""
    p = processing.probs(target_logits).double()
    q = processing.probs(draft_logits).double()
    q_raw = torch.softmax(draft_logits.double(), dim=-1)
    kept = q * torch.clamp(p / q_raw, max=1.0)
    residual = torch.clamp(p - q_raw, min=0.0)
    residual = residual / residual.sum(dim=-1, keepdim=True).clamp(min=1e-300)
    out = kept + (1 - kept.sum(dim=-1, keepdim=True)) * residual
    order = torch.argsort(p, dim=-1, descending=True, stable=True)
    shift = (torch.cumsum(out.gather(1, order), 1) - torch.cumsum(p.gather(1, order), 1)).abs().max(dim=1).values
    scores = p.clamp(min=FLOOR).log()
    centre = (p * scores).sum(dim=1, keepdim=True)
    variance = (p * (scores - centre) ** 2).sum(dim=1)
    return {"tv": 0.5 * (out - p).abs().sum(dim=1), "shift": shift, "drift": (out * (scores - centre)).sum(dim=1),
            "spread": variance.sqrt(), "variance": variance}


def by_position(rows: list[dict]) -> dict:
    """Mean σ² and drift at each position index over the prompts that reached it."""
    length = max(row["tv"].numel() for row in rows)
    figures = {}
    for key in ("variance", "drift", "tv"):
        figures[key] = [float(torch.stack([row[key][index] for row in rows if row[key].numel() > index]).mean())
                        for index in range(length)]
    return figures


def summary(figures: dict, tolerances: dict, level: float) -> dict:
    n = figures["tv"].numel()
    drift, spread, variance = (float(figures[key].sum()) for key in ("drift", "spread", "variance"))
    per_position = {key: float(figures[key].mean()) for key in figures}
    test_level = level / 3

    def sharpness_caught(positions: int) -> bool:  # the expected statistic at this many positions
        scale = positions / n
        return sharpness_test(drift * scale, spread * scale, variance * scale, tolerances["score_drift"],
                              tolerances["score_variance"]).p_value <= test_level

    def pooled_caught(positions: int) -> bool:  # as if every position's shift lay across one common edge
        return detectable_shift(positions, tolerances["tolerance"], test_level, power=0.5) <= per_position["shift"]

    return {"per_position_mean": per_position, "median_tv": float(figures["tv"].median()),
            "temperature_error": drift / variance if variance > 0 else 0.0,
            "positions_for_sharpness": least_positions(sharpness_caught),
            "positions_for_pooled_at_best": least_positions(pooled_caught)}


def least_positions(caught, ceiling: int = 10**8) -> int | None:
    """The least number of positions for which ``caught`` holds (it is monotone), None past ``ceiling``."""
    if not caught(ceiling):
        return None
    low, high = 1, ceiling
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if caught(middle) else (middle + 1, high)
    return low


if __name__ == "__main__":
    sys.exit(main())
