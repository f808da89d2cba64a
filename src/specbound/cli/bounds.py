"""``specbound bounds``: the optimal multi-draft acceptance α* (SPEC.md §4.2) for one
(target, draft) pair, next to every lossless verifier's exact acceptance.

Subcommands:
  optimum  α* of each draft scheme at one n, with the certificate H* (where drafts lose),
           for every row of a batch in a JSON file (the table shows the first
           20 tokens of a long H*; --json has them all)
  plot     α* of every draft scheme and each verifier's exact acceptance vs the number of
           drafts n, for one pair: table (or ``--json``), PNG and JSON saved to --out

The pair defaults to SPEC.md §4.4's fixture A.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specbound import arguments
from specbound.cli.inputs import FIXTURE_A, add_pair_arguments, distribution_pair
from specbound.cli.output import WORK_LIMIT_NOTE, format_table, print_json, writable_folder

DEFAULT_OUT = Path("specbound-results") / "bounds"
SHOWN_SUBSET = 20  # token ids of H* printed in the table


def run_optimum(args) -> int:
    from specbound.tables.bounds import optimum_with_certificate

    target, draft = distribution_pair(args.target, args.draft, FIXTURE_A)
    tables = optimum_with_certificate(target, draft, args.num_drafts)
    if args.json:
        print_json({"num_drafts": args.num_drafts, "schemes": tables[0]} if target.ndim == draft.ndim == 1
                   else {"num_drafts": args.num_drafts, "rows": [{"schemes": records} for records in tables]})
        return 0
    print(f"optimal acceptance α* = 1 + min_H [p(H) − Q(H)], n = {args.num_drafts}; "
          "H* = a minimising subset (token ids)")
    for row, records in enumerate(tables):
        if len(tables) > 1:
            print(f"\nrow {row}")
        rows = [[r["scheme"], r["acceptance"], _subset_text(r["subset"]), r.get("target_mass_of_subset"),
                 r["note"][:60]] for r in records]
        print(format_table(["draft scheme", "α*", "H*", "p(H*)", "note"], rows))
    return 0


def _subset_text(subset: list[int] | None) -> str | None:
    """H* as token ids, the first ``SHOWN_SUBSET`` of a longer one with the count of the rest."""
    if subset is None:
        return None
    shown = " ".join(map(str, subset[:SHOWN_SUBSET]))
    return shown if len(subset) <= SHOWN_SUBSET else f"{shown} … (+{len(subset) - SHOWN_SUBSET:,} more; --json has all)"


def run_plot(args) -> int:
    from specbound.tables.bounds import acceptance_vs_drafts
    from specbound.plots.bounds import plot_acceptance_vs_drafts

    target, draft = distribution_pair(args.target, args.draft, FIXTURE_A)
    out = writable_folder(args.out, "--out")
    numbers = acceptance_vs_drafts(target, draft, args.max_drafts, progress=not args.json)
    figure = plot_acceptance_vs_drafts(numbers, out / "acceptance_vs_drafts.png")
    saved = out / "acceptance_vs_drafts.json"
    saved.write_text(json.dumps(numbers, indent=2))
    if args.json:
        print_json(numbers)
        return 0
    headers = ["method", "draft scheme"] + [f"n = {n}" for n in numbers["num_drafts"]]
    rows = [[f"α* {scheme}", scheme, *values] for scheme, values in numbers["optimum"].items()]
    rows += [[name, v["scheme"], *v["acceptance"]] for name, v in numbers["verifiers"].items()]
    print(format_table(headers, rows))
    print(f"figure: {figure}\nnumbers: {saved}")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bounds", help="optimal multi-draft acceptance α*, its certificate, α* vs n",
        description=f"{__doc__}\n{WORK_LIMIT_NOTE}", formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="bounds_command", required=True, metavar="COMMAND")
    optimum = _add_command(commands, "optimum", run_optimum,
                           "α* of each draft scheme at one n, with the subset H* that certifies it")
    optimum.add_argument("-n", "--num-drafts", type=arguments.positive_int, default=2,
                         help="number of drafts n (default 2)")
    plot = _add_command(commands, "plot", run_plot,
                        "α* and every verifier's exact acceptance vs n: table, PNG, JSON")
    plot.add_argument("--max-drafts", type=int, default=4, help="largest n (default 4)")
    plot.add_argument("--out", type=arguments.folder, default=str(DEFAULT_OUT),
                      help=f"folder for the PNG and JSON (default {DEFAULT_OUT})")


def _add_command(commands, name: str, handler, help_text: str):
    command = commands.add_parser(name, help=help_text, description=help_text)
    add_pair_arguments(command, "; default: SPEC.md fixture A")
    command.add_argument("--json", action="store_true", help="print JSON instead of a table")
    command.set_defaults(handler=handler)
    return command
