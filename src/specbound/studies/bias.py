"""Trading bias for speed [YIN] §4: Decoding-OPT vs Decoding-UNO along real generations.

Both accept the draft x with b = min(1, (p(x) + ε)/q(x)); OPT resamples from
norm((p − q)+) — the optimal resampling law, so its bias is Loss*(b) and it sits on the
Pareto front P(reject) + bias = TV(p, q) [YIN Thm 4, 5] — and UNO from the target p.

Quality: [YIN] Table 1 compares OPT and UNO by win rate under reward models and GPT-4,
judges we do not have. The exact per-token bias TV(O_t, p_t) — how far the law of the
emitted token is from the target's, computed from the rows, not estimated — is the better
defined measure, and the one the theorems are about, so it is what this study reports.

Units: prompts × temperatures × configurations. The ``reference`` configuration is the
lossless chain (ε = 0): its generation is a target sample, and along it, from one forward
of each model, every (method, ε)'s exact per-token bias and rejection probability are
computed from the same rows (so the averaged points can be set against the averaged front
line, which is the mean of TV(p_t, q_t)). Every (method, ε) configuration then generates
with the engine for the measured speed: tokens per target call, acceptance and wall-clock,
against the reference chain of the same lookahead γ.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path


from specbound.datasets import Prompt
from specbound.engine import Processing
from specbound.engine.methods import Method, build_method
from specbound.models.pair import ModelPair
from specbound.plots.studies import plot_bias_front, plot_speed_gain
from specbound.probability import total_variation
from specbound.statistics import grouped_per_token_means, mean_and_standard_error
from specbound.studies.base import Study, Unit, UnitOutput, register_study, setting_units
from specbound.studies.document import Heading, Image, Paragraph, Table, estimate, slug
from specbound.studies.options import BIASED_METHODS
from specbound.studies.records import StudyResults
from specbound.studies.traces import TraceRequest, checked_generation_settings, generation_summary, trace_probs
from specbound.verifiers import get_verifier

REFERENCE = "reference"


@dataclass(frozen=True)
class BiasConfig:
    method: str  # "reference" (lossless chain) or a biased method
    epsilon: float

    @property
    def label(self) -> str:
        return REFERENCE if self.method == REFERENCE else f"{self.method},ε={self.epsilon:g}"

    def engine_method(self, gamma: int) -> Method:
        if self.method == REFERENCE:
            return build_method("chain", gamma=gamma)
        return build_method(self.method, gamma=gamma, epsilon=self.epsilon)


@register_study
class BiasStudy(Study):
    name = "bias"

    def __init__(
        self,
        temperatures=(0.7,),
        epsilons=(0.1, 0.2, 0.4, 0.8),
        methods=BIASED_METHODS,
        gamma: int = 4,
        max_new_tokens: int = 128,
        top_k: int | None = None,
        top_p: float | None = None,
    ):
        for method in methods:
            if method not in BIASED_METHODS:
                raise ValueError(f"methods: expected some of {', '.join(BIASED_METHODS)}, got {method!r}")
        self.temperatures = checked_generation_settings(temperatures, max_new_tokens, top_k, top_p)
        self.epsilons = [float(value) for value in epsilons]
        for epsilon in self.epsilons:
            get_verifier("decoding_opt", epsilon=epsilon)  # checks ε
        self.methods = list(methods)
        self.gamma = gamma
        self.max_new_tokens = max_new_tokens
        self.top_k, self.top_p = top_k, top_p
        self.configs = [BiasConfig(REFERENCE, 0.0)] + [
            BiasConfig(method, epsilon) for method in self.methods for epsilon in self.epsilons
        ]
        build_method("chain", gamma=gamma)  # checks γ

    @classmethod
    def from_arguments(cls, args, generation: dict) -> BiasStudy:
        return cls(epsilons=args.epsilons, methods=args.methods, gamma=args.gamma, **generation)

    def settings(self) -> dict:
        return {
            "temperatures": self.temperatures,
            "epsilons": self.epsilons,
            "methods": self.methods,
            "gamma": self.gamma,
            "max_new_tokens": self.max_new_tokens,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "generation": f"engine chains, γ = {self.gamma}; exact bias along the lossless reference",
        }

    def units(self, prompts: list[Prompt]) -> list[Unit]:
        return setting_units(prompts, self.temperatures, self.configs)

    def trace_request(self, pair: ModelPair, unit: Unit) -> TraceRequest:
        processing = Processing(unit.config["temperature"], self.top_k, self.top_p, pair.vocab_size)
        return TraceRequest(processing, unit.config["config"].engine_method(self.gamma), self.max_new_tokens)

    def unit_output(self, pair: ModelPair, unit: Unit, request: TraceRequest, trace) -> UnitOutput:
        temperature, config, processing = unit.config["temperature"], unit.config["config"], request.processing
        common = {"prompt_id": unit.prompt.id, "temperature": temperature, "config": config.label}
        run = {**common, "method": config.method, "epsilon": config.epsilon, **generation_summary(pair, trace)}
        seconds = {"generate": trace.seconds}
        if config.method != REFERENCE:
            return UnitOutput([], run, seconds)
        started = time.perf_counter()
        target_rows, draft_rows = trace_probs(pair, trace, processing)
        scored = time.perf_counter()
        divergence = total_variation(target_rows, draft_rows)
        points = []
        for method in self.methods:
            for epsilon in self.epsilons:
                verifier = get_verifier(method, epsilon=epsilon)
                points.append((method, epsilon, verifier.bias(target_rows, draft_rows),
                               verifier.rejection_rate(target_rows, draft_rows)))
        positions = [
            {
                **common,
                "position": position,
                "token": token,
                "total_variation": float(divergence[position]),
                "points": [
                    {"method": method, "epsilon": epsilon, "bias": float(bias[position]),
                     "rejection": float(rejection[position])}
                    for method, epsilon, bias, rejection in points
                ],
            }
            for position, token in enumerate(trace.tokens)
        ]
        seconds.update(score=scored - started, bias=time.perf_counter() - scored)
        return UnitOutput(positions, run, seconds)

    @staticmethod
    def summary_tables(results) -> list:
        return [("Decoding-OPT vs Decoding-UNO: exact per-token bias and rejection, measured speed",
                 bias_table(results))]

    @staticmethod
    def report_section(results: StudyResults, figure_dir: Path) -> list:
        return bias_report(results, figure_dir)


def bias_summary(results: StudyResults) -> dict:
    """Per temperature: the per-token mean TV (the front line) and, per (method, ε), the
    per-token means of bias and rejection (standard errors over prompts); per configuration,
    the measured tokens per target call, engine acceptance and tokens per second, and the
    speed gain over the lossless reference (ratio of tokens per call and of tokens/s)."""
    front = grouped_per_token_means(results.positions, lambda r: (r["temperature"],), lambda r: r["total_variation"])
    points = {}
    for name in ("bias", "rejection"):
        flat = [
            {"prompt_id": record["prompt_id"], "key": (record["temperature"], point["method"], point["epsilon"]),
             "value": point[name]}
            for record in results.positions for point in record["points"]
        ]
        for key, value in grouped_per_token_means(flat, lambda r: r["key"], lambda r: r["value"]).items():
            points.setdefault(key, {})[name] = value
    speed = {}
    for run in results.runs:
        seconds = results.timings.get(run["unit"], {}).get("generate")
        entry = speed.setdefault((run["temperature"], run["config"]), {"tokens": 0, "calls": 0, "seconds": 0.0,
                                                                       "accepted": [], "timed": True})
        entry["tokens"] += len(run["tokens"])
        entry["calls"] += run["engine"]["target_calls"]
        entry["accepted"].append(run["engine"]["acceptance_rate"])
        entry["timed"] &= seconds is not None
        entry["seconds"] += seconds or 0.0
    measured = {}
    for (temperature, label), entry in speed.items():
        measured[(temperature, label)] = {
            "tokens_per_call": entry["tokens"] / entry["calls"],
            "acceptance": mean_and_standard_error(entry["accepted"]),
            "tokens_per_second": entry["tokens"] / entry["seconds"] if entry["timed"] and entry["seconds"] else None,
        }
    for (temperature, label), values in measured.items():
        reference = measured.get((temperature, REFERENCE))
        values["gain_per_call"] = values["tokens_per_call"] / reference["tokens_per_call"] if reference else None
        timed = reference and reference["tokens_per_second"] and values["tokens_per_second"]
        values["gain_per_second"] = values["tokens_per_second"] / reference["tokens_per_second"] if timed else None
    return {
        "front": {key[0]: value for key, value in front.items()},
        "points": points,
        "measured": measured,
    }


def bias_table(results: StudyResults) -> tuple[list[str], list[list]]:
    summary = bias_summary(results)
    headers = [
        "T", "method", "ε", "bias per token", "rejection per token", "bias + rejection", "mean TV (front)",
        "tokens/call", "gain (tokens/call)", "gain (tokens/s)",
    ]
    rows = []
    for temperature in results.settings["temperatures"]:
        front = summary["front"].get(temperature)
        reference = summary["measured"].get((temperature, REFERENCE))
        if reference:
            rows.append([f"{temperature:g}", "lossless chain", "0", "0 (lossless)", estimate(front),
                         estimate(front), estimate(front), estimate(reference["tokens_per_call"], 3), "1", "1"])
        for method in results.settings["methods"]:
            for epsilon in results.settings["epsilons"]:
                point = summary["points"].get((temperature, method, epsilon), {})
                measured = summary["measured"].get((temperature, f"{method},ε={epsilon:g}"), {})
                total = point["bias"][0] + point["rejection"][0] if point else None
                rows.append([
                    f"{temperature:g}", method, f"{epsilon:g}", estimate(point.get("bias")),
                    estimate(point.get("rejection")), estimate(total), estimate(front),
                    estimate(measured.get("tokens_per_call"), 3), estimate(measured.get("gain_per_call"), 3),
                    estimate(measured.get("gain_per_second"), 3),
                ])
    return headers, rows


def bias_report(results: StudyResults, figure_dir: Path) -> list:
    dataset = results.settings["dataset"]
    summary = bias_summary(results)
    settings = results.settings
    blocks = [
        Heading(2, f"Bias vs rejections: Decoding-OPT and Decoding-UNO ({dataset}; Yin et al. §4)"),
        Paragraph(
            "Yin et al. judged output quality by win rates under reward models and GPT-4, which we do not have. "
            "We report instead the exact per-token bias TV(output law, target law), computed from the (target, "
            "draft) distributions at every position of real generations: it is exactly what the theorems bound, it "
            "needs no judge, and it has no sampling noise at each position — a better-defined measure of quality "
            "loss. Per-token means ± one standard error over prompts. Decoding-OPT sits on the Pareto front "
            "(bias + rejection = TV at every position, Thm 5); Decoding-UNO, with the same acceptance rule, pays "
            "more bias for the same rejection rate. Speed is measured with the engine (chains, "
            f"γ = {settings['gamma']}) against the lossless chain; tokens per target call is machine-independent, "
            "tokens per second is wall-clock on this CPU."
        ),
        Table(*bias_table(results)),
    ]
    for temperature in settings["temperatures"]:
        front = summary["front"].get(temperature)
        if front is None:
            continue
        sweeps, gains = {}, {}
        for method in settings["methods"]:
            label = get_verifier(method).label
            points = [summary["points"][(temperature, method, e)] for e in settings["epsilons"]]
            sweeps[label] = ([p["bias"][0] for p in points], [p["rejection"][0] for p in points], settings["epsilons"])
            measured = [summary["measured"].get((temperature, f"{method},ε={e:g}")) for e in settings["epsilons"]]
            if all(m and m["gain_per_call"] for m in measured):
                gains[label] = [m["gain_per_call"] for m in measured]
        path = figure_dir / f"bias_front_{slug(dataset)}_T{temperature:g}.png"
        plot_bias_front(front[0], sweeps, path, f"{dataset}, T = {temperature:g}: bias vs rejection per token")
        blocks.append(Image(f"{path.parent.name}/{path.name}",
                            f"{dataset}, temperature {temperature:g}: real-data points against the theoretical front"))
        if gains:
            path = figure_dir / f"bias_speed_{slug(dataset)}_T{temperature:g}.png"
            plot_speed_gain(settings["epsilons"], gains, path, f"{dataset}, T = {temperature:g}: measured speed gain")
            blocks.append(Image(f"{path.parent.name}/{path.name}",
                                f"{dataset}, temperature {temperature:g}: tokens per target call relative to the "
                                "lossless chain"))
    reference = [run for run in results.runs if run["config"] == REFERENCE]
    if reference:
        blocks.append(Paragraph(f"Reference generations: {len(reference)}, "
                                f"{sum(len(run['tokens']) for run in reference)} tokens in all."))
    return blocks
