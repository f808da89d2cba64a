"""``specbound bounds``: the optimal multi-draft acceptance α* (SPEC §4.2) for one
(target, draft) pair, next to every lossless verifier's exact acceptance.

Subcommands:
  optimum  α* of each draft scheme at one n, with the certificate H* (where drafts lose)
  plot     α* with / without replacement, greedy, and each verifier's exact acceptance
           vs the number of drafts n: table (or ``--json``), PNG and JSON saved to --out

The pair defaults to SPEC §4.4's fixture A.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from specbound.bounds import optimal_acceptance  # noqa: E402
from specbound.commands.accept import parse_distribution  # noqa: E402
from specbound.commands.output import format_table, print_json  # noqa: E402
from specbound.probability import as_target_and_draft  # noqa: E402
from specbound.verifiers import VERIFIERS, get_verifier  # noqa: E402

DEFAULT_OUT = Path("specbound-results") / "bounds"
OPTIMUM_SCHEMES = ["with_replacement", "without_replacement", "greedy"]
FIXTURE_A = ("0.4,0.3,0.2,0.1", "0.1,0.2,0.3,0.4")


def optimum_with_certificate(target_probs, draft_probs, num_drafts: int) -> list[dict]:
    """α*, the subset H* and its loss Q(H*) − p(H*) = 1 − α* for each draft scheme;
    None (with the reason) where the scheme does not apply at this n."""
    target, draft = as_target_and_draft(target_probs, draft_probs)
    records = []
    for scheme in OPTIMUM_SCHEMES + ["spechub"]:
        try:
            result = optimal_acceptance(target, draft, num_drafts, scheme)
        except ValueError as error:
            records.append({"scheme": scheme, "acceptance": None, "subset": None, "note": str(error)})
            continue
        records.append({
            "scheme": scheme,
            "acceptance": float(result.acceptance[0]),
            "subset": np.flatnonzero(result.optimal_subset[0]).tolist(),
            "target_mass_of_subset": float(target[0, result.optimal_subset[0]].sum()),
            "note": "",
        })
    return records


def acceptance_vs_drafts(target_probs, draft_probs, max_drafts: int, progress: bool = False) -> dict:
    """α* per scheme and each lossless verifier's exact acceptance for n = 1..max_drafts
    (None where a method does not apply at that n, e.g. SpecHub for n ≠ 2, or the LP
    verifier above its size limit). ``progress`` shows a bar on stderr."""
    if max_drafts < 1:
        raise ValueError(f"max_drafts: must be at least 1, got {max_drafts}")
    target, draft = as_target_and_draft(target_probs, draft_probs)
    drafts = list(range(1, max_drafts + 1))

    def curve(rate_at):
        values = []
        for num_drafts in drafts:
            try:
                values.append(float(rate_at(num_drafts)[0]))
            except ValueError:
                values.append(None)
        return values

    optimum = {
        scheme: curve(lambda n, scheme=scheme: optimal_acceptance(target, draft, n, scheme).acceptance)
        for scheme in OPTIMUM_SCHEMES
    }
    lossless = [name for name, verifier_class in VERIFIERS.items() if verifier_class.lossless]
    verifiers = {
        name: curve(lambda n, name=name: get_verifier(name).acceptance_rate(target, draft, n))
        for name in tqdm(lossless, desc="verifiers", file=sys.stderr, disable=not progress)
    }
    return {
        "target": target[0].tolist(),
        "draft": draft[0].tolist(),
        "num_drafts": drafts,
        "optimum": optimum,
        "verifiers": {
            name: {"scheme": get_verifier(name).scheme, "acceptance": values}
            for name, values in verifiers.items()
        },
    }


def plot_acceptance_vs_drafts(numbers: dict, path) -> Path:
    """α* curves (solid, filled dots) and verifier acceptance (dashed, hollow markers drawn
    on top, so a verifier that reaches α* shows as a ring around its dot) against n;
    colour = draft scheme."""
    drafts = numbers["num_drafts"]
    figure, axes = plt.subplots(figsize=(9.5, 4.8))
    colours = {"with_replacement": "tab:blue", "without_replacement": "tab:green",
               "greedy": "tab:red", "spechub": "tab:purple"}

    def draw(values, **style):
        points = [(n, value) for n, value in zip(drafts, values) if value is not None]
        if points:
            axes.plot(*zip(*points), **style)

    for scheme, values in numbers["optimum"].items():
        draw(values, color=colours[scheme], lw=2.6, marker="o", markersize=6,
             label=f"α* {scheme.replace('_', ' ')}")
    markers = iter("sDv^<>Px*")
    for name, verifier in numbers["verifiers"].items():
        draw(verifier["acceptance"], color=colours[verifier["scheme"]], lw=1.1, ls="--",
             marker=next(markers), markersize=11, markerfacecolor="none", markeredgewidth=1.4,
             zorder=3, label=f"{name} verifier")
    axes.set_xlabel("number of drafts n")
    axes.set_ylabel("acceptance P(output ∈ drafts)")
    axes.set_xticks(drafts)
    axes.set_title("Optimal acceptance α* (solid) and exact verifier acceptance (dashed), "
                   f"V = {len(numbers['target'])}\ncolour = draft scheme: blue with replacement, "
                   "green without, red greedy, purple SpecHub pairs", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=130)
    plt.close(figure)
    return path


def _pair(args):
    """(target, draft) from --target/--draft; fixture A when neither is given; a JSON file
    given as --target alone supplies both."""
    if args.target is None and args.draft is None:
        return parse_distribution(FIXTURE_A[0], "target_probs"), parse_distribution(FIXTURE_A[1], "draft_probs")
    if args.target is None:
        raise ValueError("target_probs: --draft given without --target")
    target = parse_distribution(args.target, "target_probs")
    draft = parse_distribution(args.draft if args.draft is not None else args.target, "draft_probs")
    return target, draft


def run_optimum(args) -> int:
    target, draft = _pair(args)
    records = optimum_with_certificate(target, draft, args.num_drafts)
    if args.json:
        print_json({"num_drafts": args.num_drafts, "schemes": records})
        return 0
    print(f"optimal acceptance α* = 1 + min_H [p(H) − Q(H)], n = {args.num_drafts}; "
          "H* = a minimising subset (token ids)")
    rows = [[r["scheme"], r["acceptance"], None if r["subset"] is None else " ".join(map(str, r["subset"])),
             r.get("target_mass_of_subset"), r["note"][:60]] for r in records]
    print(format_table(["draft scheme", "α*", "H*", "p(H*)", "note"], rows))
    return 0


def run_plot(args) -> int:
    target, draft = _pair(args)
    numbers = acceptance_vs_drafts(target, draft, args.max_drafts, progress=not args.json)
    out = Path(args.out)
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
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="bounds_command", required=True, metavar="COMMAND")
    optimum = _add_command(commands, "optimum", run_optimum,
                           "α* of each draft scheme at one n, with the subset H* that certifies it")
    optimum.add_argument("-n", "--num-drafts", type=int, default=2, help="number of drafts n (default 2)")
    plot = _add_command(commands, "plot", run_plot,
                        "α* and every verifier's exact acceptance vs n: table, PNG, JSON")
    plot.add_argument("--max-drafts", type=int, default=4, help="largest n (default 4)")
    plot.add_argument("--out", default=str(DEFAULT_OUT),
                      help=f"folder for the PNG and JSON (default {DEFAULT_OUT})")


def _add_command(commands, name: str, handler, help_text: str):
    command = commands.add_parser(name, help=help_text, description=help_text)
    command.add_argument("--target", help="target p: '0.4,0.3,0.2,0.1' or a JSON file (a list, or "
                         '{"target": [...], "draft": [...]}); default: SPEC fixture A')
    command.add_argument("--draft", help="draft q, same forms; defaults to the JSON file of --target")
    command.add_argument("--json", action="store_true", help="print JSON instead of a table")
    command.set_defaults(handler=handler)
    return command
