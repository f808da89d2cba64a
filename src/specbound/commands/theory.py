"""``specbound theory``: the Markov-chain cost of speculative decoding and the bias/rejection
front, as tables (or ``--json``), with a PNG figure and a JSON file of the numbers saved to
``--out`` (default ./specbound-results/theory).

Subcommands (SPEC §1-§3, [YIN] Fig. 2-4):
  convergence  Monte Carlo N_rej converging to Thm 1's exact value; finite lookahead γ
  drafts       E[N_rej] vs the number of drafts M (Thm 3) and its positive M → ∞ limit
  improvement  single-token batch improvement vs M: Bernoulli and uniform closed forms
  pareto       rejection vs bias: the front, Decoding-OPT and Decoding-UNO ε sweeps

Chains are drawn by ``random_chain_pair`` from ``--seed`` (rows of P_t, then of Q_t, i.i.d.
Dirichlet(concentration·1); uniform prompt law); the Monte Carlo runs continue the same
generator. N_rej is the paper's count (rounds ending in a rejection); target calls also count
a last round that reached the horizon without one.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from specbound import theory_figures
from specbound.chain_simulation import (
    mean_and_standard_error,
    running_mean_and_standard_error,
    simulate_decoding,
)
from specbound.chain_theory import (
    batch_expected_rejections,
    batch_improvement,
    bernoulli_batch_improvement,
    lookahead_expected_cost,
    random_chain_pair,
    uniform_batch_improvement,
)
from specbound.commands.output import format_table, print_json
from specbound.pareto import epsilon_sweep, loss_star, rejection_probability
from specbound.probability import as_target_and_draft, total_variation

DEFAULT_OUT = Path("specbound-results") / "theory"
CHAIN_LAW = "rows of P_t then Q_t i.i.d. Dirichlet(concentration·1), uniform prompt law"
SWEEP_LABELS = {
    "decoding_opt": "Decoding-OPT (R = norm((p − q)+))",
    "decoding_uno": "Decoding-UNO (R = p, paper's text)",
    "decoding_uno_draft": "Decoding-UNO (R = q, paper's code)",
}


def _numbers(text: str, kind=float) -> list:
    try:
        return [kind(value) for value in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")


def _integers(text: str) -> list[int]:
    return _numbers(text, int)


def _pairs(text: str, kind=float) -> list[tuple]:
    """'a:b;c:d' -> [(a, b), (c, d)]"""
    try:
        pairs = [tuple(kind(value) for value in pair.split(":")) for pair in text.split(";")]
    except ValueError:
        pairs = []
    if not pairs or any(len(pair) != 2 for pair in pairs):
        raise argparse.ArgumentTypeError(f"expected 'a:b;c:d' pairs, got {text!r}")
    return pairs


def _chain(args):
    """The chain drawn from ``--seed`` and the generator, to be continued by the runs."""
    rng = np.random.default_rng(args.seed)
    return random_chain_pair(args.horizon, args.vocab, rng, args.concentration), rng


def _chain_settings(args) -> dict:
    return {"horizon": args.horizon, "vocab_size": args.vocab, "seed": args.seed,
            "concentration": args.concentration, "chain_law": CHAIN_LAW}


def _finish(args, name: str, payload: dict, figure: Path, tables: list) -> int:
    """Save the numbers as JSON beside the figure; print the tables, or the JSON."""
    payload["figure"] = str(figure)
    numbers = Path(args.out) / f"{name}.json"
    numbers.write_text(json.dumps(payload, indent=2))
    if args.json:
        print_json(payload)
        return 0
    for title, headers, rows in tables:
        print(title)
        print(format_table(headers, rows))
        print()
    print(f"figure: {figure}\nnumbers: {numbers}")
    return 0


def run_convergence(args) -> int:
    chain, rng = _chain(args)
    exact = batch_expected_rejections(chain, 1)
    run = simulate_decoding(chain, args.runs, rng)
    means, errors = running_mean_and_standard_error(run.rejections)
    checkpoints = sorted({n for n in (10, 30, 100, 300, 1000, 3000, 10000) if n < args.runs}
                         | {args.runs})
    lookaheads = []
    for lookahead in tqdm(args.lookaheads, desc="lookahead γ", file=sys.stderr, disable=args.json):
        cost = lookahead_expected_cost(chain, 1, lookahead)
        simulated = simulate_decoding(chain, args.runs, rng, lookahead=lookahead)
        lookaheads.append({
            "lookahead": lookahead,
            "exact_rejections": cost.rejections,
            "mc_rejections": mean_and_standard_error(simulated.rejections),
            "exact_target_calls": cost.target_calls,
            "mc_target_calls": mean_and_standard_error(simulated.target_calls),
            "tokens_per_call": cost.tokens_per_call,
        })
    figure = theory_figures.plot_convergence(
        means, errors, exact.rejections, chain.horizon, Path(args.out) / "convergence.png",
        setting=f", V = {chain.vocab_size}, seed {args.seed}",
    )
    mc_rejections = mean_and_standard_error(run.rejections)
    mc_calls = mean_and_standard_error(run.target_calls)
    payload = {
        **_chain_settings(args), "runs": args.runs,
        "exact_rejections": exact.rejections, "mc_rejections": mc_rejections,
        "exact_target_calls": exact.target_calls, "mc_target_calls": mc_calls,
        "acceleration": exact.acceleration, "tokens_per_call": exact.tokens_per_call,
        "convergence": [{"runs": n, "mean_rejections": float(means[n - 1]),
                         "standard_error": float(errors[n - 1])} for n in checkpoints],
        "finite_lookahead": lookaheads,
    }
    summary = [
        ["E[N_rej] (Thm 1; the paper's count)", exact.rejections, *mc_rejections],
        ["E[target calls] (N_rej + final call)", exact.target_calls, *mc_calls],
        ["acceleration T / E[N_rej]", exact.acceleration, None, None],
        ["tokens per target call T / E[calls]", exact.tokens_per_call, None, None],
    ]
    tables = [
        (f"single-draft speculative sampling, K = ∞, T = {args.horizon}, V = {args.vocab}, "
         f"seed {args.seed} ({CHAIN_LAW})",
         ["quantity", "exact", "Monte Carlo", "std. error"], summary),
        ("Monte Carlo mean of N_rej vs number of runs", ["runs", "mean N_rej", "std. error"],
         [[c["runs"], c["mean_rejections"], c["standard_error"]] for c in payload["convergence"]]),
        ("finite lookahead γ with a bonus token (reported separately; same chain)",
         ["γ", "E[N_rej]", "MC N_rej", "E[calls]", "MC calls", "tokens/call"],
         [[r["lookahead"], r["exact_rejections"], r["mc_rejections"][0],
           r["exact_target_calls"], r["mc_target_calls"][0], r["tokens_per_call"]]
          for r in lookaheads]),
    ]
    return _finish(args, "convergence", payload, figure, tables)


def run_drafts(args) -> int:
    chain, rng = _chain(args)
    curve_drafts = np.unique(np.geomspace(1, args.max_drafts, 40).round().astype(int)).tolist()
    curve = [batch_expected_rejections(chain, m) for m in curve_drafts]
    limit = batch_expected_rejections(chain, math.inf)
    simulated = []
    for num_drafts in tqdm(args.simulated_drafts, desc="Monte Carlo M", file=sys.stderr,
                           disable=args.json):
        run = simulate_decoding(chain, args.runs, rng, num_drafts=num_drafts)
        exact = batch_expected_rejections(chain, num_drafts)
        simulated.append({"num_drafts": num_drafts, "exact_rejections": exact.rejections,
                          "acceleration": exact.acceleration,
                          "mc_rejections": mean_and_standard_error(run.rejections)})
    figure = theory_figures.plot_rejections_vs_drafts(
        curve_drafts, [cost.rejections for cost in curve], limit.rejections,
        [s["num_drafts"] for s in simulated], [s["mc_rejections"][0] for s in simulated],
        [s["mc_rejections"][1] for s in simulated], chain.horizon, Path(args.out) / "drafts.png",
        setting=f", V = {chain.vocab_size}, seed {args.seed}",
    )
    payload = {
        **_chain_settings(args), "runs": args.runs,
        "curve": [{"num_drafts": m, "exact_rejections": cost.rejections,
                   "exact_target_calls": cost.target_calls}
                  for m, cost in zip(curve_drafts, curve)],
        "limit": {"exact_rejections": limit.rejections, "exact_target_calls": limit.target_calls,
                  "acceleration": limit.acceleration},
        "monte_carlo": simulated,
    }
    rows = [[s["num_drafts"], s["exact_rejections"], *s["mc_rejections"], s["acceleration"]]
            for s in simulated]
    rows.append(["∞", limit.rejections, None, None, limit.acceleration])
    title = (f"batch speculative decoding, K = ∞, T = {args.horizon}, V = {args.vocab}, "
             f"seed {args.seed}; {args.runs} runs per M")
    headers = ["M", "E[N_rej] (Thm 3)", "MC mean", "std. error", "T / E[N_rej]"]
    return _finish(args, "drafts", payload, figure, [(title, headers, rows)])


def _improvement_curve(target, draft, closed_form, drafts) -> tuple[list, list, float]:
    """(closed form per M, general formula TV − Π r_m per M, general formula at M = ∞)."""
    general = [float(batch_improvement(target, draft, m)[0]) for m in drafts]
    limit = float(batch_improvement(target, draft, math.inf)[0])
    return [closed_form(m) for m in drafts], general, limit


def run_improvement(args) -> int:
    drafts = list(range(1, args.max_drafts + 1))
    bernoulli, uniform = {}, {}
    for draft_mean, target_mean in args.bernoulli:
        bernoulli[f"u = {draft_mean:g}, v = {target_mean:g}"] = _improvement_curve(
            [1 - target_mean, target_mean], [1 - draft_mean, draft_mean],
            lambda m: bernoulli_batch_improvement(draft_mean, target_mean, m), drafts,
        )
    for vocab_size, support in args.uniform:
        if not 1 <= support <= vocab_size:
            raise ValueError(f"--uniform: need 1 ≤ V′ ≤ V, got V = {vocab_size}, V′ = {support}")
        uniform[f"V = {vocab_size}, V′ = {support} (r = {vocab_size / support:.3g})"] = (
            _improvement_curve(
                np.r_[np.full(support, 1 / support), np.zeros(vocab_size - support)],
                np.full(vocab_size, 1 / vocab_size),
                lambda m: uniform_batch_improvement(vocab_size, support, m), drafts,
            )
        )
    figure = theory_figures.plot_batch_improvement(
        drafts, bernoulli, uniform, Path(args.out) / "improvement.png"
    )
    payload = {"num_drafts": drafts, "bernoulli": bernoulli, "uniform": uniform,
               "curve_format": "label -> [closed form per M, general formula per M, M = ∞]"}
    shown = drafts[:6]
    rows = [[label, *closed[:len(shown)], limit]
            for curves in (bernoulli, uniform) for label, (closed, _, limit) in curves.items()]
    headers = ["case", *[f"M={m}" for m in shown], "M=∞"]
    return _finish(args, "improvement", payload, figure,
                   [("batch improvement BI(M) = TV − Π_m TV(p^m, q)", headers, rows)])


def run_pareto(args) -> int:
    target, draft = as_target_and_draft(args.target, args.draft)
    tv = float(total_variation(target, draft)[0])
    epsilons = args.epsilons or np.linspace(0, max(float(np.max(draft - target)), 1e-3), 21).tolist()
    acceptances = np.random.default_rng(args.seed).random((args.random_points, target.shape[1]))
    random_points = np.column_stack([loss_star(target, draft, acceptances),
                                     rejection_probability(target, draft, acceptances)])
    sweeps, records = {}, []
    for method in args.methods:
        if method not in SWEEP_LABELS:
            raise ValueError(f"--methods: unknown method {method!r}; choose from {sorted(SWEEP_LABELS)}")
        points = epsilon_sweep(target, draft, epsilons, method)
        sweeps[SWEEP_LABELS[method]] = ([p.bias for p in points], [p.rejection for p in points],
                                        epsilons)
        records += [vars(point) for point in points]
    figure = theory_figures.plot_pareto_front(
        tv, random_points, sweeps, Path(args.out) / "pareto.png", annotate_epsilons=epsilons[::5]
    )
    payload = {"target": target[0].tolist(), "draft": draft[0].tolist(), "total_variation": tv,
               "sweeps": records}
    headers = ["method", "ε", "P(reject)", "bias", "Loss*(b)", "P(reject)+bias−TV"]
    rows = [[r["method"], r["epsilon"], r["rejection"], r["bias"], r["least_bias"],
             r["rejection"] + r["bias"] - tv] for r in records]
    return _finish(args, "pareto", payload, figure,
                   [(f"ε sweeps, TV(p, q) = {tv:.6f}", headers, rows)])


def run(args) -> int:
    Path(args.out).mkdir(parents=True, exist_ok=True)
    return args.theory_handler(args)


def _subcommand(commands, name: str, help_text: str, handler, chain: bool):
    parser = commands.add_parser(name, help=help_text, description=help_text)
    parser.add_argument("--out", default=str(DEFAULT_OUT),
                        help=f"folder for the PNG and JSON (default {DEFAULT_OUT})")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    if chain:
        parser.add_argument("--horizon", type=int, default=50, help="horizon T (default 50)")
        parser.add_argument("--vocab", type=int, default=7, help="number of states V (default 7)")
        parser.add_argument("--seed", type=int, default=10,
                            help="seed of the chain, then of the runs (default 10)")
        parser.add_argument("--concentration", type=float, default=1.0,
                            help="Dirichlet concentration of every transition row (default 1)")
    parser.set_defaults(theory_handler=handler)
    return parser


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "theory", help="Markov-chain cost of speculative decoding; bias vs rejection",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(handler=run)
    commands = parser.add_subparsers(dest="theory_command", required=True, metavar="FIGURE")

    convergence = _subcommand(commands, "convergence",
                              "Fig. 1: Monte Carlo N_rej converging to Thm 1", run_convergence, True)
    convergence.add_argument("--runs", type=int, default=5000, help="Monte Carlo runs (5000)")
    convergence.add_argument("--lookaheads", type=_integers, default=[2, 4, 8],
                             help="finite lookaheads γ reported separately (default 2,4,8)")

    drafts = _subcommand(commands, "drafts", "Fig. 2: E[N_rej] vs number of drafts M (Thm 3)",
                         run_drafts, True)
    drafts.add_argument("--max-drafts", type=int, default=1000,
                        help="largest M on the exact curve (default 1000)")
    drafts.add_argument("--simulated-drafts", type=_integers, default=[1, 2, 4, 8, 16, 32],
                        help="M values run by Monte Carlo (default 1,2,4,8,16,32)")
    drafts.add_argument("--runs", type=int, default=1000, help="Monte Carlo runs per M (1000)")

    improvement = _subcommand(commands, "improvement", "Fig. 3: batch improvement vs M",
                              run_improvement, False)
    improvement.add_argument("--max-drafts", type=int, default=20, help="largest M (default 20)")
    improvement.add_argument("--bernoulli", type=_pairs, default=_pairs("0.9:0.5;0.6:0.3;0.3:0.1"),
                             help="draft mean u : target mean v pairs (default 0.9:0.5;0.6:0.3;0.3:0.1)")
    improvement.add_argument("--uniform", type=lambda text: _pairs(text, int),
                             default=_pairs("2:1;4:1;10:1;8:6", int),
                             help="vocabulary V : target support V′ pairs (default 2:1;4:1;10:1;8:6)")

    pareto = _subcommand(commands, "pareto", "Fig. 4: rejection vs bias; OPT and UNO ε sweeps",
                         run_pareto, False)
    pareto.add_argument("--target", type=_numbers, default=[0.4, 0.3, 0.2, 0.1],
                        help="target p, comma-separated (default SPEC fixture A)")
    pareto.add_argument("--draft", type=_numbers, default=[0.1, 0.2, 0.3, 0.4],
                        help="draft q, comma-separated (default SPEC fixture A)")
    pareto.add_argument("--epsilons", type=_numbers,
                        help="ε values (default 21 evenly from 0 to max(q − p))")
    pareto.add_argument("--methods", type=lambda text: text.split(","),
                        default=list(SWEEP_LABELS), help=f"comma-separated: {', '.join(SWEEP_LABELS)}")
    pareto.add_argument("--random-points", type=int, default=400,
                        help="random acceptance vectors drawn for the achievable region (400)")
    pareto.add_argument("--seed", type=int, default=0, help="seed of the random vectors (0)")
