"""``specbound theory``: the Markov-chain cost of speculative decoding and the bias/rejection
front, as tables (or ``--json``), with a PNG figure and a JSON file of the numbers saved to
``--out`` (default ./specbound-results/theory).

Subcommands (SPEC.md §1-§3, [YIN] Fig. 2-4):
  convergence  Monte Carlo N_rej converging to Thm 1's exact value; finite lookahead γ
  drafts       E[N_rej] vs the number of drafts M (Thm 3) and its positive M → ∞ limit
  improvement  single-token batch improvement vs M: Bernoulli and uniform closed forms
  pareto       rejection vs bias: the front, Decoding-OPT and Decoding-UNO ε sweeps

The numbers come from ``specbound.tables.chains`` (which says how chains are drawn),
the figures from ``specbound.plots.theory``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specbound import arguments
from specbound.cli.output import WORK_LIMIT_NOTE, format_table, print_json, writable_folder

DEFAULT_OUT = Path("specbound-results") / "theory"
MAX_CONCENTRATION = 1e6


def _setting(args):
    """The chain of ``--horizon``, ``--vocab``, ``--seed``, ``--concentration``."""
    from specbound.tables.chains import ChainSetting

    return ChainSetting(args.horizon, args.vocab, args.seed, args.concentration)


def _finish(args, name: str, numbers: dict, figure: Path, tables: list) -> int:
    """Save the numbers as JSON beside the figure; print the tables, or the JSON."""
    numbers = {**numbers, "figure": str(figure)}
    saved = Path(args.out) / f"{name}.json"
    saved.write_text(json.dumps(numbers, indent=2))
    if args.json:
        print_json(numbers)
        return 0
    for title, headers, rows in tables:
        print(title)
        print(format_table(headers, rows))
        print()
    print(f"figure: {figure}\nnumbers: {saved}")
    return 0


def _setting_text(numbers: dict) -> str:
    return (f"T = {numbers['horizon']}, V = {numbers['vocab_size']}, seed {numbers['seed']} "
            f"({numbers['chain_law']})")


def run_convergence(args) -> int:
    from specbound.tables import chains
    from specbound.plots import theory as figures

    result = chains.convergence(_setting(args), args.runs, args.lookaheads, progress=not args.json)
    numbers = result.numbers
    figure = figures.plot_convergence(
        result.figure["running_means"], result.figure["running_errors"], numbers["exact_rejections"],
        numbers["horizon"], Path(args.out) / "convergence.png",
        setting=f", V = {numbers['vocab_size']}, seed {numbers['seed']}",
    )
    summary = [
        ["E[N_rej] (Thm 1; the paper's count)", numbers["exact_rejections"], *numbers["mc_rejections"]],
        ["E[target calls] (N_rej + final call)", numbers["exact_target_calls"], *numbers["mc_target_calls"]],
        ["acceleration T / E[N_rej]", numbers["acceleration"], None, None],
        ["tokens per target call T / E[calls]", numbers["tokens_per_call"], None, None],
    ]
    tables = [
        (f"single-draft speculative sampling, K = ∞, {_setting_text(numbers)}",
         ["quantity", "exact", "Monte Carlo", "std. error"], summary),
        ("Monte Carlo mean of N_rej vs number of runs", ["runs", "mean N_rej", "std. error"],
         [[c["runs"], c["mean_rejections"], c["standard_error"]] for c in numbers["convergence"]]),
        ("finite lookahead γ with a bonus token (reported separately; same chain)",
         ["γ", "E[N_rej]", "MC N_rej", "E[calls]", "MC calls", "tokens/call"],
         [[r["lookahead"], r["exact_rejections"], r["mc_rejections"][0],
           r["exact_target_calls"], r["mc_target_calls"][0], r["tokens_per_call"]]
          for r in numbers["finite_lookahead"]]),
    ]
    return _finish(args, "convergence", numbers, figure, tables)


def run_drafts(args) -> int:
    from specbound.tables import chains
    from specbound.plots import theory as figures

    numbers = chains.drafts(_setting(args), args.max_drafts, args.simulated_drafts, args.runs,
                                 progress=not args.json).numbers
    simulated = numbers["monte_carlo"]
    figure = figures.plot_rejections_vs_drafts(
        [c["num_drafts"] for c in numbers["curve"]], [c["exact_rejections"] for c in numbers["curve"]],
        numbers["limit"]["exact_rejections"],
        [s["num_drafts"] for s in simulated], [s["mc_rejections"][0] for s in simulated],
        [s["mc_rejections"][1] for s in simulated], numbers["horizon"], Path(args.out) / "drafts.png",
        setting=f", V = {numbers['vocab_size']}, seed {numbers['seed']}",
    )
    rows = [[s["num_drafts"], s["exact_rejections"], *s["mc_rejections"], s["acceleration"]] for s in simulated]
    rows.append(["∞", numbers["limit"]["exact_rejections"], None, None, numbers["limit"]["acceleration"]])
    title = f"batch speculative decoding, K = ∞, {_setting_text(numbers)}; {args.runs} runs per M"
    headers = ["M", "E[N_rej] (Thm 3)", "MC mean", "std. error", "T / E[N_rej]"]
    return _finish(args, "drafts", numbers, figure, [(title, headers, rows)])


def run_improvement(args) -> int:
    from specbound.tables import chains
    from specbound.plots import theory as figures

    numbers = chains.improvement(args.max_drafts, args.bernoulli, args.uniform).numbers
    figure = figures.plot_batch_improvement(numbers["num_drafts"], numbers["bernoulli"], numbers["uniform"],
                                            Path(args.out) / "improvement.png")
    shown = numbers["num_drafts"][:6]
    rows = [[label, *closed[:len(shown)], limit]
            for curves in (numbers["bernoulli"], numbers["uniform"]) for label, (closed, _, limit) in curves.items()]
    headers = ["case", *[f"M={m}" for m in shown], "M=∞"]
    return _finish(args, "improvement", numbers, figure,
                   [("batch improvement BI(M) = TV − Π_m TV(p^m, q)", headers, rows)])


def run_pareto(args) -> int:
    from specbound.tables import chains
    from specbound.plots import theory as figures
    from specbound.verifiers.biased import sweep_verifier

    result = chains.pareto(args.target, args.draft, args.epsilons, args.methods, args.random_points, args.seed)
    numbers, epsilons = result.numbers, result.figure["epsilons"]
    tv = numbers["total_variation"]
    sweeps = {}
    for method in args.methods:
        points = [point for point in numbers["sweeps"] if point["method"] == method]
        sweeps[sweep_verifier(method, 0.0).label] = ([p["bias"] for p in points], [p["rejection"] for p in points],
                                                     epsilons)
    figure = figures.plot_pareto_front(tv, result.figure["random_points"], sweeps, Path(args.out) / "pareto.png",
                                       annotate_epsilons=epsilons[::5])
    headers = ["method", "ε", "P(reject)", "bias", "Loss*(b)", "P(reject)+bias−TV"]
    rows = [[r["method"], r["epsilon"], r["rejection"], r["bias"], r["least_bias"],
             r["rejection"] + r["bias"] - tv] for r in numbers["sweeps"]]
    return _finish(args, "pareto", numbers, figure, [(f"ε sweeps, TV(p, q) = {tv:.6f}", headers, rows)])


def run(args) -> int:
    writable_folder(args.out, "--out")
    return args.theory_handler(args)


def _subcommand(commands, name: str, help_text: str, handler, chain: bool):
    parser = commands.add_parser(name, help=help_text, description=help_text)
    parser.add_argument("--out", type=arguments.folder, default=str(DEFAULT_OUT),
                        help=f"folder for the PNG and JSON (default {DEFAULT_OUT})")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    if chain:
        parser.add_argument("--horizon", type=arguments.positive_int, default=50, help="horizon T (default 50)")
        parser.add_argument("--vocab", type=arguments.integer(2), default=7,
                            help="number of states V ≥ 2 (default 7; one state never rejects)")
        parser.add_argument("--seed", type=arguments.seed, default=10,
                            help="seed of the chain, then of the runs (default 10)")
        parser.add_argument("--concentration", type=arguments.number(0.0, MAX_CONCENTRATION, low_open=True),
                            default=1.0, help="Dirichlet concentration of every transition row (default 1; "
                            f"at most {MAX_CONCENTRATION:g}: beyond, the rows are uniform to rounding and never reject)")
    parser.set_defaults(theory_handler=handler)
    return parser


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "theory", help="Markov-chain cost of speculative decoding; bias vs rejection",
        description=f"{__doc__}\n{WORK_LIMIT_NOTE}", formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(handler=run)
    subparsers.choices.defer("theory", _add_figures)


def _add_figures(parser) -> None:
    """One subcommand per figure; ``pareto``'s methods are read from ``verifiers.biased``
    (which imports numba and scipy) on the command's first use."""
    from specbound.verifiers.biased import SWEEP_METHODS

    commands = parser.add_subparsers(dest="theory_command", required=True, metavar="FIGURE")

    convergence = _subcommand(commands, "convergence",
                              "Fig. 1: Monte Carlo N_rej converging to Thm 1", run_convergence, True)
    convergence.add_argument("--runs", type=arguments.positive_int, default=5000, help="Monte Carlo runs (5000)")
    convergence.add_argument("--lookaheads", type=arguments.comma_list(arguments.positive_int), default=[2, 4, 8],
                             help="finite lookaheads γ reported separately (default 2,4,8)")

    drafts = _subcommand(commands, "drafts", "Fig. 2: E[N_rej] vs number of drafts M (Thm 3)",
                         run_drafts, True)
    drafts.add_argument("--max-drafts", type=arguments.positive_int, default=1000,
                        help="largest M on the exact curve (default 1000)")
    drafts.add_argument("--simulated-drafts", type=arguments.comma_list(arguments.positive_int),
                        default=[1, 2, 4, 8, 16, 32],
                        help="M values run by Monte Carlo (default 1,2,4,8,16,32)")
    drafts.add_argument("--runs", type=arguments.positive_int, default=1000, help="Monte Carlo runs per M (1000)")

    improvement = _subcommand(commands, "improvement", "Fig. 3: batch improvement vs M",
                              run_improvement, False)
    improvement.add_argument("--max-drafts", type=arguments.positive_int, default=20, help="largest M (default 20)")
    improvement.add_argument("--bernoulli", type=arguments.pairs(arguments.number(0.0, 1.0)),
                             default=[(0.9, 0.5), (0.6, 0.3), (0.3, 0.1)],
                             help="draft mean u : target mean v pairs (default 0.9:0.5;0.6:0.3;0.3:0.1)")
    improvement.add_argument("--uniform", type=arguments.pairs(arguments.positive_int),
                             default=[(2, 1), (4, 1), (10, 1), (8, 6)],
                             help="vocabulary V : target support V′ pairs (default 2:1;4:1;10:1;8:6)")

    pareto = _subcommand(commands, "pareto", "Fig. 4: rejection vs bias; OPT and UNO ε sweeps",
                         run_pareto, False)
    pareto.add_argument("--target", type=arguments.numbers, default=[0.4, 0.3, 0.2, 0.1],
                        help="target p, comma-separated (default SPEC.md fixture A)")
    pareto.add_argument("--draft", type=arguments.numbers, default=[0.1, 0.2, 0.3, 0.4],
                        help="draft q, comma-separated (default SPEC.md fixture A)")
    pareto.add_argument("--epsilons", type=arguments.comma_list(arguments.number(0.0)),
                        help="ε values (default 21 evenly from 0 to max(q − p))")
    pareto.add_argument("--methods", type=arguments.names(list(SWEEP_METHODS)), default=list(SWEEP_METHODS),
                        help=f"comma-separated: {', '.join(SWEEP_METHODS)}")
    pareto.add_argument("--random-points", type=arguments.positive_int, default=400,
                        help="random acceptance vectors drawn for the achievable region (400)")
    pareto.add_argument("--seed", type=arguments.seed, default=0, help="seed of the random vectors (0)")
