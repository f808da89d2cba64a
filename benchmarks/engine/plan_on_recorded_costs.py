"""What ``auto`` plans on a machine we do not have: the planner fed recorded forward costs.

The issue asks that ``auto`` never lose to plain decoding, by the planner's own choice, on an
AVX2-only CPU, where a bf16 forward costs time linear in its rows. This script builds the
planner (``specbound.engine.planner.Planner``) from forward costs recorded by
``bench_forward_rows`` — an AVX2-only CPU's (``results/engine/forward_rows_avx2.jsonl``, an
older format: ``dtype``, ``rows_seconds``, no machine) and an AVX-512 one's
(``results/engine/forward_rows_avx512.jsonl``) — gives it the per-depth acceptance measured on the default
pair (``--acceptance``, a single draft, as seen over thousands of verifications, so the prior
no longer matters) and prints, for each record, the plain-decoding speed, the plan chosen
and its predicted speed, and writes them to ``--output`` (a ``benchmarks.record`` envelope).
Nothing is loaded; it runs in a second.

    python -m benchmarks.engine.plan_on_recorded_costs --acceptance 0.87
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks import record
from specbound.engine.costs import Costs
from specbound.engine.planner import Evidence, Planner


def recorded(path: Path) -> dict[str, dict]:
    """{"target": {precision: Costs}, "draft": {...}, "machine": text} from a record file:
    the last record of each (model, precision), the machine from the last envelope."""
    found: dict = {"target": {}, "draft": {}, "machine": ""}
    for line in path.read_text().splitlines():
        result = json.loads(line)
        if record.is_envelope(result):
            found["machine"] = result["machine"].get("gpu") or result["machine"]["cpu_model"]
            continue
        precision = result.get("precision") or {"bfloat16": "bf16"}.get(result.get("dtype"), result.get("dtype"))
        role = "target" if "target" in result["model"] else "draft"
        found[role][precision] = Costs({int(rows): seconds for rows, seconds in result["rows_seconds"].items()})
    return found


def plan(costs: dict, acceptance: float, draft_precisions) -> tuple[float, str, float]:
    """(plain decoding tokens/s, the best plan's label, its predicted tokens/s)."""
    drafts = {None if precision == "bf16" else precision: costs["draft"][precision]
              for precision in draft_precisions if precision in costs["draft"]}
    planner = Planner(costs["target"]["bf16"], drafts)
    evidence = planner.evidence.setdefault("model", Evidence())
    for depth in range(16):  # thousands of single-draft verifications at the measured acceptance
        evidence.record(depth, 1, True, count=round(10_000 * acceptance))
        evidence.record(depth, 1, False, count=10_000 - round(10_000 * acceptance))
    plain = planner.predict(planner.candidates[0]).tokens_per_second
    best = planner.best()
    return plain, best.candidate.label, best.tokens_per_second


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--acceptance", type=float, default=0.87,
                        help="single-draft acceptance per depth (default 0.87, chain γ=4 on humaneval at T = 0.7)")
    parser.add_argument("--records", nargs="*", default=[str(record.RESULTS / "engine" / "forward_rows_avx2.jsonl"),
                                                         str(record.RESULTS / "engine" / "forward_rows_avx512.jsonl")])
    record.add_output(parser, "engine/plan_on_recorded_costs.json")
    args = parser.parse_args()
    rows = []
    print(f"single-draft acceptance {args.acceptance} at every depth")
    print("| record | machine | draft precisions | plain tokens/s | plan | predicted tokens/s | × plain |")
    print("|---|---|---|---|---|---|---|")
    for name in args.records:
        path = Path(name)
        if not path.exists():
            print(f"| {path.name} | (missing: run benchmarks.engine.bench_forward_rows) | | | | | |")
            continue
        costs = recorded(path)
        for precisions in (("bf16",), ("bf16", "int8", "int4")):
            if not set(precisions) <= set(costs["draft"]):
                continue
            plain, label, predicted = plan(costs, args.acceptance, precisions)
            rows.append({"record": path.name, "machine": costs["machine"] or None, "draft_precisions": precisions,
                         "plain_tokens_per_second": plain, "plan": label, "predicted_tokens_per_second": predicted})
            print(f"| {path.name} | {costs['machine'] or 'an AVX2-only CPU (no machine recorded)'} | "
                  f"{','.join(precisions)} | {plain:.2f} | {label} | {predicted:.2f} | {predicted / plain:.2f} |")
    record.write(args.output, {"acceptance": args.acceptance, "rows": rows})


if __name__ == "__main__":
    main()
