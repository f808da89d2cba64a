"""``specbound accept``: exact acceptance of every verifier and the optimum, for one
(target, draft) pair given on the command line or in a JSON file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from specbound.bounds import optimal_acceptance
from specbound.commands.output import format_table, print_json
from specbound.probability import as_target_and_draft
from specbound.verifiers import VERIFIERS, get_verifier

OPTIMUM_SCHEMES = ["with_replacement", "without_replacement", "greedy"]
GAP_NOISE = 1e-9  # the LP verifier's optimum is exact to HiGHS' 1e-10 tolerances


def parse_distribution(text: str, name: str) -> np.ndarray:
    """Comma-separated probabilities, or a path to a JSON list / {"target", "draft"} object."""
    path = Path(text)
    if path.suffix == ".json" or path.is_file():
        try:
            payload = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"{name}: cannot read JSON file {text!r}: {error}") from None
        if isinstance(payload, dict):
            key = "target" if name == "target_probs" else "draft"
            if key not in payload:
                raise ValueError(f"{name}: JSON object in {text!r} has no {key!r} list")
            payload = payload[key]
        return np.asarray(payload, dtype=np.float64)
    try:
        return np.array([float(value) for value in text.split(",")])
    except ValueError:
        raise ValueError(f"{name}: expected comma-separated numbers or a JSON file, got {text!r}") from None


def acceptance_table(target_probs, draft_probs, num_drafts: int) -> list[dict]:
    """One record per method: its draft scheme, exact acceptance, the scheme's α*, and the gap.

    A verifier that does not apply (SpecHub for n ≠ 2, the LP verifier above its size
    limit, too few distinct draft tokens) gets acceptance None and the reason.
    """
    target, draft = as_target_and_draft(target_probs, draft_probs)
    optimum = {}
    for scheme in OPTIMUM_SCHEMES + ["spechub"]:
        try:
            optimum[scheme] = float(optimal_acceptance(target, draft, num_drafts, scheme).acceptance[0])
        except ValueError:
            optimum[scheme] = None
    records = [
        {"method": f"optimal α* ({scheme})", "scheme": scheme, "acceptance": optimum[scheme],
         "optimum": optimum[scheme], "gap": 0.0 if optimum[scheme] is not None else None, "note": ""}
        for scheme in OPTIMUM_SCHEMES
    ]
    for name, verifier_class in VERIFIERS.items():
        if not verifier_class.lossless:
            continue
        verifier = get_verifier(name)
        drafts = 1 if name == "single" else num_drafts
        try:
            rate, note = float(verifier.acceptance_rate(target, draft, drafts)[0]), ""
        except ValueError as error:
            rate, note = None, str(error)
        best = optimum.get(verifier.scheme) if drafts == num_drafts else rate
        gap = None if rate is None or best is None else best - rate
        if gap is not None and abs(gap) <= GAP_NOISE:
            gap = 0.0
        records.append({
            "method": name, "scheme": verifier.scheme, "num_drafts": drafts, "acceptance": rate,
            "optimum": best, "gap": gap, "note": note,
        })
    return records


def run(args: argparse.Namespace) -> int:
    target = parse_distribution(args.target, "target_probs")
    draft = parse_distribution(args.draft if args.draft is not None else args.target, "draft_probs")
    records = acceptance_table(target, draft, args.num_drafts)
    if args.json:
        print_json({"num_drafts": args.num_drafts, "target": target.tolist(), "draft": draft.tolist(), "methods": records})
        return 0
    print(f"exact acceptance P(output ∈ drafts), n = {args.num_drafts} drafts "
          f"(single = Σ min(p, q), one draft)")
    rows = [[r["method"], r["scheme"], r["acceptance"], r["gap"]] for r in records]
    print(format_table(["method", "draft scheme", "acceptance", "gap to α*"], rows))
    for record in records:
        if record["note"]:
            print(f"{record['method']}: not applicable — {record['note']}")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "accept",
        help="exact acceptance of every verifier and the optimal acceptance α*",
        description="Print, for a target p and a draft q, every lossless verifier's exact "
        "acceptance rate and the optimal multi-draft acceptance α* of each draft scheme.",
    )
    parser.add_argument("--target", required=True, help="target probabilities p: '0.4,0.3,0.2,0.1' or a JSON file "
                        '(a list, or {"target": [...], "draft": [...]})')
    parser.add_argument("--draft", help="draft probabilities q (same forms); defaults to the JSON file of --target")
    parser.add_argument("-n", "--num-drafts", type=int, default=2, help="number of drafts n (default 2)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(handler=run)
