"""What one forward costs as a function of its rows, and what that allows speculation to win.

Speculative decoding pays off when the target scores k + 1 rows (a chain of k drafts, or a
tree of k nodes) for little more than one row. On a GPU, or a CPU with bf16/AMX units, a
forward over 1-16 rows costs about one row's; on a CPU with AVX2 only, a bfloat16 matrix
product re-reads its weights once per row, so the cost grows with every row. This
benchmark measures, for each model and dtype, the prefill of a 200-token prompt and one
forward over k = 1, 2, 4, 8, 16 new rows on top of that cache (the minimum over repeats:
the least disturbed figure on a shared machine). It then fits cost(k) = a + b·k and prints
what a method must reach to beat plain decoding:

    time per token of plain decoding            = cost_target(1)
    time per step of a chain with γ drafts      = γ·cost_draft(1) + cost_target(γ + 1)
    tokens per step with per-token acceptance α = (1 − α^(γ+1)) / (1 − α)

and the break-even α for γ = 1..8 (none when no α ≤ 1 breaks even). A tree n × d with
N = n + n² + ... + n^d nodes costs cost_target(N + 1) per step for at most d + 1 tokens:
when the cost per row b is large against the fixed part a, as on an AVX2 CPU in bf16, its
extra nodes cost more than its higher acceptance gains.

    python benchmarks/bench_forward_rows.py --threads 2
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from specbound.engine import CausalLM
from specbound.models.loading import load_model

ROWS = (1, 2, 4, 8, 16)
PROMPT_TOKENS = 200


def forward_costs(model, repeats: int) -> dict:
    """Seconds: prefill of PROMPT_TOKENS, then one engine forward of k speculative rows (a
    chain below the last prompt token, as ``extend_tree`` scores them) on that cache."""
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 1000, (PROMPT_TOKENS,), generator=generator)
    lm = CausalLM(model)
    started = time.perf_counter()
    lm.extend(prompt, last_only=True)
    prefill = time.perf_counter() - started
    costs = {}
    for rows in ROWS:
        best = float("inf")
        for _ in range(repeats):
            tokens = torch.randint(0, 1000, (rows,), generator=generator)
            parents = [lm.committed_length - 1 + index for index in range(rows)]
            started = time.perf_counter()
            lm.extend_tree(tokens, parents).logits([0])
            best = min(best, time.perf_counter() - started)
            lm.commit([])  # roll back to the prompt
        costs[rows] = best
    return {"prefill_seconds": prefill, "rows_seconds": costs}


def linear_fit(costs: dict) -> tuple[float, float]:
    """Least squares cost(k) = a + b·k over the measured rows."""
    rows = torch.tensor(list(costs), dtype=torch.float64)
    seconds = torch.tensor(list(costs.values()), dtype=torch.float64)
    design = torch.stack([torch.ones_like(rows), rows], dim=1)
    a, b = torch.linalg.lstsq(design, seconds[:, None]).solution[:, 0].tolist()
    return a, b


def break_even_acceptance(target: dict, draft: dict, gamma: int) -> float | None:
    """Smallest α at which a γ-chain's tokens/s equals plain decoding's (None if none ≤ 1)."""
    step = gamma * draft[1] + _cost(target, gamma + 1)
    needed = step / target[1]  # tokens per step needed
    low, high = 0.0, 1.0
    if gamma + 1 < needed:
        return None
    for _ in range(60):
        middle = (low + high) / 2
        tokens = sum(middle**i for i in range(gamma + 1))
        low, high = (middle, high) if tokens < needed else (low, middle)
    return high


def _cost(costs: dict, rows: int) -> float:
    if rows in costs:
        return costs[rows]
    a, b = linear_fit(costs)
    return a + b * rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default="benchmarks/results/bench_forward_rows.jsonl")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    measured = {}
    with open(args.output, "a") as output:
        for name in ("default-draft", "default-target"):
            model = load_model(name).model
            for dtype in (torch.bfloat16, torch.float32):
                model.to(dtype)
                result = forward_costs(model, args.repeats)
                measured[(name, dtype)] = result["rows_seconds"]
                record = {"model": name, "dtype": str(dtype).removeprefix("torch."), "threads": args.threads,
                          "prompt_tokens": PROMPT_TOKENS, **result}
                output.write(json.dumps(record) + "\n")
                output.flush()
                costs = "  ".join(f"{rows}: {seconds * 1000:.0f} ms" for rows, seconds in result["rows_seconds"].items())
                a, b = linear_fit(result["rows_seconds"])
                print(f"{name:15s} {record['dtype']:8s} prefill {result['prefill_seconds']:.1f} s   {costs}"
                      f"   fit {a * 1000:.0f} + {b * 1000:.0f}·k ms")
            del model
    for dtype in (torch.bfloat16, torch.float32):
        target, draft = measured[("default-target", dtype)], measured[("default-draft", dtype)]
        line = ", ".join(
            f"γ={gamma}: {'none' if (alpha := break_even_acceptance(target, draft, gamma)) is None else f'{alpha:.3f}'}"
            for gamma in range(1, 9)
        )
        print(f"{str(dtype).removeprefix('torch.')}: acceptance α a chain needs to match plain decoding: {line}")


if __name__ == "__main__":
    main()
