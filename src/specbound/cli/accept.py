"""``specbound accept``: exact acceptance of every verifier and the optimum, for one
(target, draft) pair given on the command line or in a JSON file, or for every row of a
batch in a JSON file (JSON: one entry per row under "rows"; a table per row). With
``--shared`` the draft is restricted to the tokens it shares with the target (a draft with
another tokenizer, TLI: ``tables.bounds.restricted_draft``) and each row's bound
p(shared) ≥ α* ≥ every acceptance is printed beside the table."""

from __future__ import annotations

import argparse

import numpy as np

from specbound import arguments
from specbound.cli.inputs import add_pair_arguments, distribution_pair
from specbound.cli.output import WORK_LIMIT_NOTE, format_table, print_json


def run(args: argparse.Namespace) -> int:
    from specbound.tables.bounds import acceptance_table, restricted_draft

    target, draft = distribution_pair(args.target, args.draft)
    bounds = None
    if args.shared is not None:  # the draft restricted to the tokens it shares with the target (TLI)
        given_ndim = np.ndim(draft)
        draft, bounds = restricted_draft(target, draft, args.shared)
        draft = draft[0] if given_ndim == 1 and np.ndim(target) == 1 else draft
    tables = acceptance_table(target, draft, args.num_drafts)
    if args.json:
        targets, drafts = np.broadcast_arrays(np.atleast_2d(target), np.atleast_2d(draft))  # a row against a batch
        shared = {} if bounds is None else {"shared": args.shared}
        rows = [{"target": t.tolist(), "draft": d.tolist(), "methods": records,
                 **({} if bounds is None else {"shared_mass": float(bounds[row])})}
                for row, (t, d, records) in enumerate(zip(targets, drafts, tables))]
        print_json({"num_drafts": args.num_drafts, **shared, **rows[0]} if target.ndim == draft.ndim == 1
                   else {"num_drafts": args.num_drafts, **shared, "rows": rows})
        return 0
    print(f"exact acceptance P(output ∈ drafts), n = {args.num_drafts} drafts "
          "(a verifier with its own count — single draft, SpecHub — at that count)")
    if bounds is not None:
        print(f"draft restricted to the {len(set(args.shared))} shared tokens (renormalised on them): every "
              "acceptance ≤ α* ≤ p(shared)")
    for row, records in enumerate(tables):
        if len(tables) > 1:
            print(f"\nrow {row}")
        if bounds is not None:
            print(f"bound p(shared) = {bounds[row]:.6f}")
        rows = [[r["method"], r["scheme"], r["num_drafts"], r["acceptance"], r["gap"]] for r in records]
        print(format_table(["method", "draft scheme", "n", "acceptance", "gap to α*"], rows))
        for record in records:
            if record["note"]:
                reason = "not applicable — " if record["acceptance"] is None else ""
                print(f"{record['method']}: {reason}{record['note']}")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "accept",
        help="exact acceptance of every verifier and the optimal acceptance α*",
        description="Print, for a target p and a draft q, every lossless verifier's exact "
        "acceptance rate and the optimal multi-draft acceptance α* of each draft scheme; "
        f"a JSON file of several rows gets every row's numbers. {WORK_LIMIT_NOTE}",
    )
    add_pair_arguments(parser)
    parser.add_argument("-n", "--num-drafts", type=arguments.positive_int, default=2,
                        help="number of drafts n (default 2)")
    parser.add_argument("--shared", type=arguments.comma_list(arguments.non_negative_int), default=None,
                        help="token indices the draft's vocabulary shares with the target's, e.g. '0,1,3': the draft "
                        "is restricted to them and renormalised (a draft with another tokenizer, TLI), and the "
                        "bound p(shared) on every acceptance and α* is printed")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(handler=run)
