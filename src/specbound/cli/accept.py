"""``specbound accept``: exact acceptance of every verifier and the optimum, for one
(target, draft) pair given on the command line or in a JSON file."""

from __future__ import annotations

import argparse

from specbound.cli.inputs import add_pair_arguments, distribution_pair
from specbound.cli.output import format_table, print_json
from specbound.experiments.bounds import acceptance_table


def run(args: argparse.Namespace) -> int:
    target, draft = distribution_pair(args.target, args.draft)
    records = acceptance_table(target, draft, args.num_drafts)
    if args.json:
        print_json({"num_drafts": args.num_drafts, "target": target.tolist(), "draft": draft.tolist(), "methods": records})
        return 0
    print(f"exact acceptance P(output ∈ drafts), n = {args.num_drafts} drafts "
          "(a verifier with its own count — single draft, SpecHub — at that count)")
    rows = [[r["method"], r["scheme"], r["num_drafts"], r["acceptance"], r["gap"]] for r in records]
    print(format_table(["method", "draft scheme", "n", "acceptance", "gap to α*"], rows))
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
    add_pair_arguments(parser)
    parser.add_argument("-n", "--num-drafts", type=int, default=2, help="number of drafts n (default 2)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(handler=run)
