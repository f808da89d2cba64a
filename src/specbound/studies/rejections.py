"""Theory vs practice [YIN] §3: predicted and measured rejections along real generations.

Units: prompts × temperatures × engine configurations (M drafts at the root, lookahead γ):
single-draft chains with γ ∈ ``lookaheads`` (None: K = ∞, drafting to the horizon — the
engine cuts every round at the remaining length) and batch speculative decoding [YIN Alg. 4]
with M ∈ ``batch_sizes`` at ``batch_lookahead``. Each unit generates a fixed horizon of
``max_new_tokens`` tokens with that configuration (EOS does not stop it: the theorems are
for a fixed T), scores the generated sequence with one forward of each model, and records
- measured: the engine's rejections (steps that ended with a residual token) and target
  calls;
- predicted for this very configuration and trace: ``trace_expected_cost`` with the
  engine's rounds — an unbiased estimate of the measured counts, so their difference has
  mean zero when engine and theory agree;
- the papers' formula: Thm 1 (Σ_t TV(p_t, q_t), M = 1) or Thm 3 (M > 1) along the trace,
  K = ∞ with every position verified; the predicted acceleration is T / that.
Averages are over prompts, with standard errors over prompts.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from dataclasses import dataclass

import numpy as np

from specbound.checks import positive_int
from specbound.datasets import Prompt
from specbound.engine import Processing
from specbound.engine.methods import Method, batch, chain
from specbound.models.pair import ModelPair
from specbound.plots.studies import plot_rejections
from specbound.probability import total_variation
from specbound.statistics import mean_and_standard_error
from specbound.studies.base import Study, Unit, UnitOutput, register_study, setting_units
from specbound.studies.document import Heading, Image, Paragraph, Table, estimate, slug
from specbound.studies.records import StudyResults
from specbound.studies.sizes import drafted_lookahead
from specbound.studies.trace_theory import trace_expected_cost
from specbound.studies.traces import TraceRequest, checked_generation_settings, generation_summary, trace_probs


@dataclass(frozen=True)
class DecodingConfig:
    num_drafts: int  # M i.i.d. drafts at each round's root
    lookahead: int | None  # γ; None = K = ∞ (to the horizon)

    @property
    def label(self) -> str:
        lookahead = "∞" if self.lookahead is None else str(self.lookahead)
        return f"M={self.num_drafts},γ={lookahead}"

    def method(self, horizon: int) -> Method:
        """The engine's method; a lookahead beyond the horizon drafts to the horizon (K = ∞).
        Refused, naming the setting, beyond the drafted tokens one target call verifies."""
        gamma = drafted_lookahead(self.num_drafts, self.lookahead, horizon)
        return chain(gamma) if self.num_drafts == 1 else batch(self.num_drafts, gamma)


def decoding_configs(lookaheads, batch_sizes, batch_lookahead) -> list[DecodingConfig]:
    """Chains at each lookahead, then batch SD at each M (M = 1 only if not already there)."""
    configs = [DecodingConfig(1, lookahead) for lookahead in lookaheads]
    for num_drafts in batch_sizes:
        config = DecodingConfig(num_drafts, batch_lookahead)
        if config not in configs:
            configs.append(config)
    return configs


def _lookahead(value) -> int | None:
    if value is None or value == math.inf:
        return None
    return positive_int("lookahead", value)


@register_study
class RejectionsStudy(Study):
    name = "rejections"

    def __init__(
        self,
        temperatures=(0.7,),
        max_new_tokens: int = 128,
        lookaheads=(None, 2, 4, 8),
        batch_sizes=(1, 2, 4, 8),
        batch_lookahead: int | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
    ):
        batch_sizes = [positive_int("batch_sizes", size) for size in batch_sizes]
        self.temperatures = checked_generation_settings(temperatures, max_new_tokens, top_k, top_p)
        self.max_new_tokens = max_new_tokens
        self.configs = decoding_configs(
            [_lookahead(value) for value in lookaheads], list(batch_sizes), _lookahead(batch_lookahead)
        )
        for config in self.configs:  # what the engine checks (a batch no target call could verify), now
            config.method(self.max_new_tokens)
        self.top_k, self.top_p = top_k, top_p

    @classmethod
    def from_arguments(cls, args, generation: dict) -> RejectionsStudy:
        return cls(lookaheads=args.lookaheads, batch_sizes=args.batch_sizes,
                   batch_lookahead=args.batch_lookahead, **generation)

    def settings(self) -> dict:
        return {
            "temperatures": self.temperatures,
            "max_new_tokens": self.max_new_tokens,
            "configs": [config.label for config in self.configs],
            "top_k": self.top_k,
            "top_p": self.top_p,
            "generation": "fixed horizon (EOS does not stop), each configuration generates its own trace",
        }

    def units(self, prompts: list[Prompt]) -> list[Unit]:
        return setting_units(prompts, self.temperatures, self.configs)

    def trace_request(self, pair: ModelPair, unit: Unit) -> TraceRequest:
        processing = Processing(unit.config["temperature"], self.top_k, self.top_p, pair.vocab_size)
        return TraceRequest(processing, unit.config["config"].method(self.max_new_tokens), self.max_new_tokens,
                            stop_at_eos=False)

    def unit_output(self, pair: ModelPair, unit: Unit, request: TraceRequest, trace) -> UnitOutput:
        temperature, config, processing = unit.config["temperature"], unit.config["config"], request.processing
        started = time.perf_counter()
        target_rows, draft_rows = trace_probs(pair, trace, processing)
        scored = time.perf_counter()
        tokens = np.array(trace.tokens)
        engine_rounds = trace_expected_cost(
            target_rows, draft_rows, tokens, config.num_drafts, config.lookahead, last_token_bonus=True
        )
        theorem = trace_expected_cost(target_rows, draft_rows, tokens, config.num_drafts, None, last_token_bonus=False)
        divergence = total_variation(target_rows, draft_rows)
        common = {"prompt_id": unit.prompt.id, "temperature": temperature, "config": config.label}
        positions = [
            {
                **common,
                "position": position,
                "token": int(tokens[position]),
                "total_variation": float(divergence[position]),
                "expected_rejection": float(engine_rounds.expected_rejection[position]),
                "round_start": float(engine_rounds.round_start[position]),
            }
            for position in range(len(tokens))
        ]
        run = {
            **common,
            "num_drafts": config.num_drafts,
            "lookahead": config.lookahead,
            "horizon": len(tokens),
            "measured": {"rejections": trace.stats.rejections, "target_calls": trace.stats.target_calls},
            "predicted": {"rejections": engine_rounds.rejections, "target_calls": engine_rounds.target_calls},
            "theorem_rejections": theorem.rejections,
            "sum_total_variation": float(divergence.sum()),
            **generation_summary(pair, trace),
        }
        seconds = {
            "generate": trace.seconds,
            "score": scored - started,
            "theory": time.perf_counter() - scored,
        }
        return UnitOutput(positions, run, seconds)

    @staticmethod
    def summary_tables(results) -> list:
        return [("rejections per sequence: measured vs predicted (± s.e. over prompts)", rejections_table(results))]

    @staticmethod
    def report_section(results: StudyResults, figure_dir: Path) -> list:
        return rejections_report(results, figure_dir)


def _ratio(tokens: float, count: float) -> float:
    """T / E[N_rej], infinite when nothing was rejected."""
    return tokens / count if count > 0 else math.inf


def rejections_summary(results: StudyResults) -> list[dict]:
    """Per (temperature, configuration): means over prompts of the measured, predicted and
    theorem counts, the paired difference measured − predicted, accelerations."""
    groups: dict[tuple, list[dict]] = {}
    for run in results.runs:
        groups.setdefault((run["temperature"], run["config"]), []).append(run)
    order = {label: index for index, label in enumerate(results.settings["configs"])}
    summary = []
    for (temperature, label), runs in sorted(groups.items(), key=lambda item: (item[0][0], order[item[0][1]])):
        horizon = sum(run["horizon"] for run in runs)
        measured = [run["measured"]["rejections"] for run in runs]
        predicted = [run["predicted"]["rejections"] for run in runs]
        theorem = [run["theorem_rejections"] for run in runs]
        measured_calls = [run["measured"]["target_calls"] for run in runs]
        predicted_calls = [run["predicted"]["target_calls"] for run in runs]
        summary.append({
            "temperature": temperature,
            "config": label,
            "num_drafts": runs[0]["num_drafts"],
            "lookahead": runs[0]["lookahead"],
            "prompts": len(runs),
            "horizon": horizon / len(runs),
            "measured_rejections": mean_and_standard_error(measured),
            "predicted_rejections": mean_and_standard_error(predicted),
            "theorem_rejections": mean_and_standard_error(theorem),
            "difference": mean_and_standard_error(np.subtract(measured, predicted)),
            "measured_calls": mean_and_standard_error(measured_calls),
            "predicted_calls": mean_and_standard_error(predicted_calls),
            "measured_acceleration": _ratio(horizon, sum(measured)),
            "theorem_acceleration": _ratio(horizon, sum(theorem)),
            "measured_tokens_per_call": horizon / sum(measured_calls),
            "predicted_tokens_per_call": horizon / sum(predicted_calls),
        })
    return summary


def rejections_table(results: StudyResults) -> tuple[list[str], list[list]]:
    headers = [
        "T", "config", "prompts", "measured N_rej", "predicted N_rej", "measured − predicted",
        "Thm 1/3 (K=∞)", "T/N_rej measured", "T/N_rej Thm", "tokens/call measured", "tokens/call predicted",
    ]
    rows = [
        [
            f"{row['temperature']:g}", row["config"], str(row["prompts"]),
            estimate(row["measured_rejections"], 2), estimate(row["predicted_rejections"], 2),
            estimate(row["difference"], 2), estimate(row["theorem_rejections"], 2),
            estimate(row["measured_acceleration"], 2), estimate(row["theorem_acceleration"], 2),
            estimate(row["measured_tokens_per_call"], 2), estimate(row["predicted_tokens_per_call"], 2),
        ]
        for row in rejections_summary(results)
    ]
    return headers, rows


def rejections_report(results: StudyResults, figure_dir: Path) -> list:
    dataset = results.settings["dataset"]
    summary = rejections_summary(results)
    blocks = [
        Heading(2, f"Theory vs practice: rejections ({dataset}; Yin et al., SPEC.md §1–§3)"),
        Paragraph(
            "Each configuration (M drafts at the root, lookahead γ; γ = ∞ drafts to the horizon, the paper's K = ∞) "
            "generates a fixed horizon of T tokens with the engine. Measured: the engine's rejections (steps that "
            "ended with a residual token) and target calls. Predicted: along the very same trace, the exact "
            "conditional expectation of the rejections for the engine's rounds (`studies.trace_theory`) — an "
            "unbiased estimate, so measured − predicted should be 0 within its standard error. Thm 1 / Thm 3: the "
            "papers' K = ∞ formula along the trace (for M = 1 it is Σ_t TV(p_t, q_t)); T / N_rej is the paper's "
            "acceleration. Means over prompts ± one standard error."
        ),
        Table(*rejections_table(results)),
    ]
    for temperature in results.settings["temperatures"]:
        rows = [row for row in summary if row["temperature"] == temperature]
        if not rows:
            continue
        path = figure_dir / f"rejections_{slug(dataset)}_T{temperature:g}.png"
        plot_rejections(
            [row["config"] for row in rows],
            _columns(rows, "measured_rejections"), _columns(rows, "predicted_rejections"),
            _columns(rows, "theorem_rejections"), rows[0]["horizon"], path,
            f"{dataset}, T = {temperature:g}: rejections per sequence",
        )
        blocks.append(Image(f"{path.parent.name}/{path.name}",
                            f"{dataset}, temperature {temperature:g}: measured vs predicted rejections (±2 s.e.)"))
    return blocks


def _columns(rows, key):
    return [row[key][0] for row in rows], [row[key][1] for row in rows]
