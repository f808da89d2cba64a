"""What ``auto`` plans on a machine we do not have: the planner fed recorded forward costs.

The issue asks that ``auto`` never lose to plain decoding, by the planner's own choice, on an
AVX2-only CPU, where a bf16 forward costs time linear in its rows. This script builds the
planner (``specbound.engine.planner.Planner``) from forward costs recorded by
``bench_forward_rows.py`` — the AVX2 machine's (``results/bench_forward_rows.jsonl``, the
old format: ``dtype``, ``rows_seconds``) and this machine's (``results/forward_rows.jsonl``:
``precision``, ``rows_seconds``) — gives it the per-depth acceptance measured on the default
pair (``--acceptance``, a single draft, as seen over thousands of verifications, so the prior
no longer matters) and prints, for each record, the plain-decoding speed, the plan chosen
and its predicted speed. Nothing is loaded; it runs in a second.

    python benchmarks/plan_on_recorded_costs.py --acceptance 0.87
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specbound.engine.costs import Costs
from specbound.engine.planner import Evidence, Planner

RESULTS = Path(__file__).resolve().parent / "results"


def recorded(path: Path) -> dict[str, dict]:
    """{"target": {precision: Costs}, "draft": {...}, "machine": text} from a record file:
    the last record of each (model, precision)."""
    found: dict = {"target": {}, "draft": {}, "machine": ""}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        precision = record.get("precision") or {"bfloat16": "bf16"}.get(record.get("dtype"), record.get("dtype"))
        role = "target" if "target" in record["model"] else "draft"
        found[role][precision] = Costs({int(rows): seconds for rows, seconds in record["rows_seconds"].items()})
        machine = record.get("lscpu", {}).get("model") or record.get("gpu")
        found["machine"] = machine or found["machine"]
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
    parser.add_argument("--records", nargs="*", default=[str(RESULTS / "bench_forward_rows.jsonl"),
                                                         str(RESULTS / "forward_rows.jsonl")])
    args = parser.parse_args()
    print(f"single-draft acceptance {args.acceptance} at every depth")
    print("| record | machine | draft precisions | plain tokens/s | plan | predicted tokens/s | × plain |")
    print("|---|---|---|---|---|---|---|")
    for name in args.records:
        path = Path(name)
        if not path.exists():
            print(f"| {path.name} | (missing: run bench_forward_rows.py) | | | | | |")
            continue
        costs = recorded(path)
        for precisions in (("bf16",), ("bf16", "int8", "int4")):
            if not set(precisions) <= set(costs["draft"]):
                continue
            plain, label, predicted = plan(costs, args.acceptance, precisions)
            print(f"| {path.name} | {costs['machine'] or 'AVX2-only CPU (recorded before lscpu was kept)'} | "
                  f"{','.join(precisions)} | {plain:.2f} | {label} | {predicted:.2f} | {predicted / plain:.2f} |")


if __name__ == "__main__":
    main()
