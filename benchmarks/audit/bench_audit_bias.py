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

    python -m benchmarks.audit.bench_audit_bias --prompts instructions --limit 8 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import json
import sys

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
    record.add_output(parser, "audit/bias.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair(args.target, args.draft, progress=False, backend="torch")
    rounding = pair.backend.rounding
    processing = Processing(args.temperature, args.top_k or None, None, pair.vocab_size)
    rows = []
    for index, prompt in enumerate(load_prompts(args.prompts, limit=args.limit)):
        ids = torch.tensor([pair.encode(prompt.text)])
        torch.manual_seed(index)
        with torch.no_grad():
            full = pair.target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                                        do_sample=True, temperature=args.temperature, top_k=args.top_k or None)
            span = slice(ids.shape[1] - 1, full.shape[1] - 1)
            target_logits = pair.target(full).logits[0, span, : pair.vocab_size].float()
            draft_logits = pair.draft(full).logits[0, span, : pair.vocab_size].float()
        rows.append(position_figures(processing, target_logits, draft_logits))
        print(f"prompt {index + 1}/{args.limit}", file=sys.stderr)
    figures = {key: torch.cat([row[key] for row in rows]) for key in rows[0]}
    result = {"settings": vars(args), "positions": int(figures["tv"].numel()), **summary(figures, rounding, args.level),
              "tolerances": {"tolerance": rounding.mean_tv, "score_drift": rounding.score_drift,
                             "score_variance": rounding.score_variance}}
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


def summary(figures: dict, rounding, level: float) -> dict:
    n = figures["tv"].numel()
    drift, spread, variance = (float(figures[key].sum()) for key in ("drift", "spread", "variance"))
    per_position = {key: float(figures[key].mean()) for key in figures}
    test_level = level / 3

    def sharpness_caught(positions: int) -> bool:  # the expected statistic at this many positions
        scale = positions / n
        return sharpness_test(drift * scale, spread * scale, variance * scale, rounding.score_drift,
                              rounding.score_variance).p_value <= test_level

    def pooled_caught(positions: int) -> bool:  # as if every position's shift lay across one common edge
        return detectable_shift(positions, rounding.mean_tv, test_level, power=0.5) <= per_position["shift"]

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
