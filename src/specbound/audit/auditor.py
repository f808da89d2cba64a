"""``audit``: does a speculative engine sample from its target's law? (SPEC.md §0: lossless
means the emitted tokens have the target's law under the sampling settings.)

The engine under audit is a ``sampler(prompt_ids, max_new_tokens, seed) -> list[int]`` (the
new tokens, EOS included where it stopped there); the reference is the same weights without
speculation (``audit.reference``). ``samples`` continuations are drawn, spread evenly over
the prompts (prompt-major order), each with its own seed from ``numpy.random.SeedSequence
(seed)``; every sampled token is scored by the reference by teacher forcing, its law made by
the engine's own ``engine.processing.Processing`` (temperature, top-k, top-p), and scored
again at the other batch shapes an engine may use, which sets the tolerances
(``audit.tolerances``: the reference's own disagreement, times a margin). The three tests of
``audit.pit`` are run: the pooled PIT test over every position, the shared-context test
(every prompt's first token, and any later context several samples reached) and the
sharpness test (every position, its noise scaled to the rows' uncertainty), at ``level``
together (Bonferroni: each at level/3). Under the null of ``audit.tolerances`` — a correct
engine's rows lie within the margin times the reference's measured disagreement with itself
— or, for tolerances given explicitly, the null of ``audit.pit`` at those, the audit fails
with probability at most ``level``.

**Verdicts.** ``failed``: the p-value is at most the level. ``inconclusive``: not failed, and
either no position was scored (every sample ended at once) or the audit could not have
detected anything: no per-position TV ≤ 1 (``detectable_tv``) and no error in temperature
below 100% (``detectable_sharpening`` ≥ 1: a flattening to any temperature goes unseen);
``needed_samples`` then says how many samples of these prompts and ``max_new_tokens`` would
detect a per-position TV of ``NEEDED_TV``. ``passed`` otherwise
— what it rules out is what ``detectable_tv`` and ``detectable_sharpening`` say.

``detectable_tv``: the per-position shift across the reference's probability ranking (a TV
at least as large) that the pooled test catches with probability ≥ 0.99 at this sample
count (``audit.pit.detectable_shift``), scaled up by the share of positions scored when
sequences end before ``max_new_tokens``. ``detectable_sharpening``: the error in temperature,
as a share (an engine sampling at T/(1 ± ε)), the sharpness test catches with probability
≥ 0.99 at this audit's rows (``audit.pit.detectable_sharpening``).

``AuditResult.to_dict`` is its summary as strict JSON values (None for an undefined or
infinite figure: ``strict_json``).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass

import numpy as np
import torch

from specbound.audit.pit import (ContextGroup, ContextTest, PooledTest, SharpnessTest, context_test,
                                 detectable_sharpening, detectable_shift, disagreement, pit_intervals, pooled_test,
                                 sharpness_terms, sharpness_test, top_categories)
from specbound.audit.reference import as_reference
from specbound.audit.tolerances import MARGIN, ROUNDING_FLOOR, SHAPES, MeasuredRounding, tolerances_of
from specbound.checks import positive_int
from specbound.engine.processing import Processing

VERDICTS = ("passed", "failed", "inconclusive")
NEEDED_TV = 0.5  # the per-position TV ``needed_samples`` is stated for


@dataclass(frozen=True)
class PositionStat:
    position: int  # 1 = the first new token
    scored: int  # samples that reached it
    p_value: float  # the pooled test on this position's values alone (not corrected for the positions)
    edge: float  # its worst edge
    fraction: float  # the share of values at or below that edge (edge itself under the null)


@dataclass
class AuditResult:
    verdict: str  # one of VERDICTS (module docstring)
    reason: str  # why, in one line
    needed_samples: int | None  # inconclusive: samples that would detect a TV of NEEDED_TV (None: none would)
    p_value: float  # Bonferroni of the three tests
    detectable_tv: float  # module docstring
    positions: list[PositionStat]  # by position
    level: float
    tolerance: float  # the pooled test's mean per-position TV
    row_tolerance: float  # the largest row tolerance of a shared context (each has its own where measured)
    sharpness_tolerance: float
    variance_tolerance: float
    rounding: MeasuredRounding  # how the tolerances were set (``audit.tolerances``)
    pooled: PooledTest
    shared: ContextTest
    sharpness: SharpnessTest
    detectable_sharpening: float  # module docstring
    pit: np.ndarray  # [samples, max_new_tokens] the PIT values, fresh uniforms after a sequence ended
    samples: list[dict]  # per sample: prompt (index), seed, tokens
    scored: int  # positions scored (the rest were past a sequence's end)
    seconds: dict[str, float] = field(default_factory=dict)  # "sampling", "scoring", "measuring"

    @property
    def passed(self) -> bool:
        return self.verdict == "passed"

    def worst_positions(self, count: int = 5) -> list[PositionStat]:
        return sorted(self.positions, key=lambda stat: stat.p_value)[:count]

    def to_dict(self) -> dict:
        """The summary — verdict, figures, tolerances, the three tests, the worst positions —
        as strict JSON values (no PIT values, no samples)."""
        return strict_json({
            "verdict": self.verdict, "passed": self.passed, "reason": self.reason,
            "needed_samples": self.needed_samples, "p_value": self.p_value, "level": self.level,
            "detectable_tv": self.detectable_tv, "detectable_sharpening": self.detectable_sharpening,
            "tolerance": self.tolerance, "row_tolerance": self.row_tolerance,
            "sharpness_tolerance": self.sharpness_tolerance, "variance_tolerance": self.variance_tolerance,
            "rounding": self.rounding, "samples": len(self.samples), "positions_scored": self.scored,
            "pooled": {"p_value": self.pooled.p_value, "edge": self.pooled.edge, "fraction": self.pooled.fraction},
            "shared_context": self.shared, "sharpness": self.sharpness,
            "worst_positions": self.worst_positions(), "seconds": self.seconds})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), allow_nan=False)


def strict_json(value):
    """``value`` with every float that JSON cannot hold (NaN, ±inf) as None, numpy numbers and
    arrays as Python's, dataclasses as dicts, recursively."""
    if is_dataclass(value) and not isinstance(value, type):
        return strict_json(asdict(value))
    if isinstance(value, dict):
        return {str(key): strict_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [strict_json(item) for item in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return value


@dataclass
class _Scored:
    """What the audit keeps of one scored continuation: its PIT intervals, its rows' top
    categories, its sharpness sums, and its rows' disagreement across batch shapes."""

    mass_before: np.ndarray  # [n]
    taken: np.ndarray  # [n]
    top_tokens: torch.Tensor  # [n, K]
    top_masses: torch.Tensor  # [n, K]
    sharpness: np.ndarray  # ΣX, Σσ, Σσ²
    tv: np.ndarray | None  # [n] d_t (None: not measured)
    drift: np.ndarray | None  # [n] a_t
    excess: np.ndarray | None  # [n] v_t


def audit(sampler: Callable[[list[int], int, int], list[int]], reference, prompts: Sequence[Sequence[int]], *,
          temperature: float, top_k: int = 0, top_p: float = 1.0, max_new_tokens: int, samples: int, seed: int = 0,
          level: float = 1e-3, tolerance: float | None = None, row_tolerance: float | None = None,
          sharpness_tolerance: float | None = None, variance_tolerance: float | None = None,
          vocab_size: int | None = None, on_sample: Callable[[int, dict], None] | None = None) -> AuditResult:
    """Audit ``sampler`` against ``reference`` (module docstring). ``top_k`` 0 and ``top_p``
    1 turn them off; a tolerance left None is measured on the reference (``audit.tolerances``;
    a reference with no batch shapes: its backend's stated rounding, else the widest);
    ``vocab_size``: the logits kept (the tokenizer's size where the model's rows are padded;
    None keeps them all); ``on_sample(index, record)`` is told each sample as it is scored
    (progress, saving as it goes). ValueError naming the argument for bad input: prompts with
    ids outside the reference's vocabulary, a sampler that raises, returns something that is
    not token ids, more than ``max_new_tokens`` or ids outside the vocabulary."""
    positive_int("max_new_tokens", max_new_tokens)
    positive_int("samples", samples)
    if not 0 < level < 1:
        raise ValueError(f"level: expected a number in (0, 1), got {level!r}")
    given = {"tolerance": tolerance, "row_tolerance": row_tolerance, "sharpness_tolerance": sharpness_tolerance,
             "variance_tolerance": variance_tolerance}
    for name, value in given.items():
        if value is not None and not (isinstance(value, (int, float)) and 0 <= value < 1):
            raise ValueError(f"{name}: expected a number in [0, 1) or None, got {value!r}")
    top_k = None if top_k in (0, None) else top_k
    processing = Processing(temperature, top_k, None if top_p is None or top_p >= 1 else top_p, vocab_size)
    scorer = as_reference(reference)
    vocab = vocab_size or scorer.vocab_size
    if vocab > scorer.vocab_size:
        raise ValueError(f"vocab_size: {vocab} exceeds the reference's {scorer.vocab_size} logits")
    prompts = _checked_prompts(prompts, vocab)
    measuring = scorer.language_model is not None and any(value is None for value in given.values())
    seeds = np.random.SeedSequence(seed).generate_state(samples).tolist()
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    pit = rng.random((samples, max_new_tokens))  # PIT randomisation where scored, the values themselves past the end
    groups: dict[tuple, ContextGroup] = {}  # (prompt, tokens so far) -> its group
    records, seconds, scored = [], {"sampling": 0.0, "scoring": 0.0, "measuring": 0.0}, 0
    sharp = np.zeros(3)  # the sharpness test's ΣX, Σσ, Σσ²
    rounding = np.zeros(3)  # Σd_t, Σa_t, Σv_t over the scored positions
    largest = 0.0  # the largest d_t
    kept: dict[tuple, _Scored] = {}  # (prompt, tokens) -> its scoring, for a continuation sampled again
    for index, prompt in enumerate(_prompt_order(len(prompts), samples)):
        started = time.perf_counter()
        tokens = _sampled(sampler, prompts[prompt], max_new_tokens, seeds[index], vocab, index)
        seconds["sampling"] += time.perf_counter() - started
        if tokens:
            key = (prompt, tuple(tokens))
            if key not in kept:
                kept[key] = _scored(scorer, processing, prompts[prompt], tokens, max_new_tokens, measuring, seconds)
            row = kept[key]
            pit[index, : len(tokens)] = np.clip(row.mass_before + pit[index, : len(tokens)] * row.taken, 0.0, 1.0)
            tolerances = MARGIN * row.tv + ROUNDING_FLOOR if measuring else None
            _join_groups(groups, prompt, tokens, row.top_tokens, row.top_masses, tolerances)
            sharp += row.sharpness
            if measuring:
                rounding += [row.tv.sum(), row.drift.sum(), row.excess.sum()]
                largest = max(largest, float(row.tv.max()))
            scored += len(tokens)
        record = {"index": index, "prompt": prompt, "seed": seeds[index], "tokens": tokens}
        records.append(record)
        if on_sample is not None:
            on_sample(index, record)
    measured = _measured_rounding(measuring, scored, rounding, largest, sharp, given)
    defaults = (_measured_tolerances(measured, scored, pit.size) if measuring
                else tolerances_of(getattr(scorer, "backend", None)))
    tolerance, row_tolerance, sharpness_tolerance, variance_tolerance = (
        value if value is not None else default for value, default in zip(given.values(), defaults))
    pooled = pooled_test(pit, tolerance)
    shared = context_test(list(groups.values()), max_new_tokens, given["row_tolerance"] if measuring else row_tolerance)
    if measuring and given["row_tolerance"] is None:
        row_tolerance = max((group.tolerance for group in groups.values()), default=ROUNDING_FLOOR)
    sharpness = sharpness_test(*sharp, sharpness_tolerance, variance_tolerance)
    p_value = min(1.0, 3 * min(pooled.p_value, shared.p_value, sharpness.p_value))
    detectable = _detectable_tv(pit.size, scored, tolerance, level)
    sharpening = detectable_sharpening(sharp[1], sharp[2], sharpness_tolerance, variance_tolerance, level / 3)
    positions = []
    for column in range(max_new_tokens):
        test = pooled_test(pit[:, column], tolerance)
        reached = sum(1 for record in records if len(record["tokens"]) > column)
        positions.append(PositionStat(column + 1, reached, test.p_value, test.edge, test.fraction))
    verdict, reason, needed = _verdict(p_value, level, scored, detectable, sharpening, (pooled, shared, sharpness),
                                       samples, max_new_tokens, tolerance)
    return AuditResult(verdict, reason, needed, p_value, detectable, positions, level, tolerance, row_tolerance,
                       sharpness_tolerance, variance_tolerance, measured, pooled, shared, sharpness, sharpening,
                       pit, records, scored, seconds)


def _scored(scorer, processing: Processing, prompt: list[int], tokens: list[int], room: int, measuring: bool,
            seconds: dict) -> _Scored:
    """One continuation scored by the reference (and at its other batch shapes when measuring)."""
    started = time.perf_counter()
    probs = processing.probs(scorer.logits(prompt, tokens, room=room))  # [len, vocab]
    ids = torch.tensor(tokens)
    mass_before, taken = pit_intervals(probs, ids)
    row = _Scored(mass_before, taken, *top_categories(probs), np.array(sharpness_terms(probs, ids)), None, None, None)
    seconds["scoring"] += time.perf_counter() - started
    if measuring:
        started = time.perf_counter()
        others = scorer.shape_logits(prompt, tokens, room=room)  # [shapes, len, logits]
        row.tv, row.drift, row.excess = disagreement(probs, processing.probs(others.flatten(0, 1)).view(
            len(SHAPES), len(tokens), -1))
        seconds["measuring"] += time.perf_counter() - started
    return row


def _measured_rounding(measuring: bool, scored: int, sums: np.ndarray, largest: float, sharp: np.ndarray,
                       given: dict) -> MeasuredRounding:
    explicit = [name for name, value in given.items() if value is not None]
    if not measuring:
        return MeasuredRounding(False, given=explicit)
    return MeasuredRounding(True, list(SHAPES), scored, float(sums[0] / scored) if scored else 0.0, largest,
                            float(sums[1] / sharp[1]) if sharp[1] > 0 else 0.0,
                            float(sums[2] / sharp[2]) if sharp[2] > 0 else 0.0, given=explicit)


def _measured_tolerances(measured: MeasuredRounding, scored: int, values: int) -> tuple[float, None, float, float]:
    """(tolerance, None, sharpness_tolerance, variance_tolerance) from the measurement
    (``audit.tolerances``): the shared contexts' row tolerances are each group's own."""
    tolerance = (MARGIN * measured.mean_tv + ROUNDING_FLOOR) * scored / values
    return (tolerance, None, MARGIN * measured.score_drift + ROUNDING_FLOOR,
            MARGIN * measured.score_variance + ROUNDING_FLOOR)


def _detectable_tv(values: int, scored: int, tolerance: float, level: float) -> float:
    """``detectable_tv`` (module docstring) of ``values`` PIT values of which ``scored`` were scored."""
    return detectable_shift(values, tolerance, level / 3) * values / scored if scored else math.inf


def _verdict(p_value: float, level: float, scored: int, detectable: float, sharpening: float, tests: tuple,
             samples: int, max_new_tokens: int, tolerance: float) -> tuple[str, str, int | None]:
    """(verdict, reason, needed_samples) (module docstring)."""
    if p_value <= level:
        pooled, shared, sharpness = tests
        name = min((pooled.p_value, "the pooled test"), (shared.p_value, "the shared-context test"),
                   (sharpness.p_value, "the sharpness test"))[1]
        return "failed", f"p = {p_value:.3g} <= level {level:g}: {name} rejects", None
    if scored == 0:
        return "inconclusive", "no position was scored: every sample returned no tokens", None
    if not detectable <= 1 and not sharpening < 1:
        needed = _needed_samples(samples, max_new_tokens, scored, tolerance, level)
        return ("inconclusive", f"{scored} positions scored detect no per-position TV <= 1 nor any error in "
                f"temperature below 100% at level {level:g}", needed)
    return "passed", f"p = {p_value:.3g} > level {level:g}", None


def _needed_samples(samples: int, max_new_tokens: int, scored: int, tolerance: float, level: float) -> int | None:
    """``needed_samples`` (module docstring): ``samples_to_detect`` of ``NEEDED_TV``."""
    return samples_to_detect(NEEDED_TV, max_new_tokens, scored / samples, tolerance, level)


def samples_to_detect(tv: float, max_new_tokens: int, scored_per_sample: float, tolerance: float,
                      level: float) -> int | None:
    """The least sample count whose audit at ``level`` has ``detectable_tv`` ≤ ``tv``, each
    sample scoring ``scored_per_sample`` of its ``max_new_tokens`` positions (None: none has,
    the tolerance being too wide)."""
    def detects(count: int) -> bool:
        scored = max(1, round(count * scored_per_sample))
        return _detectable_tv(count * max_new_tokens, scored, tolerance, level) <= tv

    high = 1
    while not detects(high):
        high *= 2
        if high > 1 << 50:
            return None
    low = high // 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if detects(middle) else (middle, high)
    return high


def _join_groups(groups: dict, prompt: int, tokens: list[int], top_tokens: torch.Tensor, top_masses: torch.Tensor,
                 tolerances: np.ndarray | None) -> None:
    """Count each of a sample's tokens in the group of its context, the group made (with the
    reference's categories there and its row tolerance, 0 where none is measured) by the first
    sample that reaches it.  # [len, K] x2, [len]"""
    for position, token in enumerate(tokens):
        key = (prompt, tuple(tokens[:position]))
        if key not in groups:
            groups[key] = ContextGroup(prompt, position + 1, top_tokens[position].tolist(),
                                       top_masses[position].tolist(),
                                       tolerance=0.0 if tolerances is None else float(tolerances[position]))
        groups[key].drawn.append(token)


def _prompt_order(prompts: int, samples: int) -> list[int]:
    """Each sample's prompt: the samples spread evenly (counts differ by at most one),
    prompt-major, so that a prompt's samples are scored one after the other."""
    return [prompt for prompt in range(prompts) for _ in range(samples // prompts + (prompt < samples % prompts))]


def _checked_prompts(prompts, vocab: int) -> list[list[int]]:
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
        raise ValueError("prompts: expected a non-empty list of token-id lists")
    checked = []
    for index, prompt in enumerate(prompts):
        ids = _token_ids(prompt)
        if ids is None or not ids:
            raise ValueError(f"prompts: prompt {index} is not a non-empty list of token ids")
        if min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"prompts: prompt {index} holds ids outside the reference's vocabulary [0, {vocab})")
        checked.append(ids)
    return checked


def _token_ids(values) -> list[int] | None:
    """``values`` as a list of ints, None where they are not integers."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        return None
    ids = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            return None
        ids.append(int(value))
    return ids


def _described(output) -> str:
    """What a sampler returned instead of token ids: its type, and for a sequence the type of
    the first item that is no integer."""
    if isinstance(output, (str, bytes)) or not hasattr(output, "__iter__"):
        return type(output).__name__
    odd = next((item for item in output if isinstance(item, bool) or not isinstance(item, (int, np.integer))), None)
    return f"a {type(output).__name__} holding {type(odd).__name__}"


def _sampled(sampler, prompt: list[int], max_new_tokens: int, seed: int, vocab: int, index: int) -> list[int]:
    """The sampler's tokens for one sample, checked (ValueError naming ``sampler``)."""
    try:
        output = sampler(list(prompt), max_new_tokens, seed)
    except Exception as error:  # noqa: BLE001 (any failure of the engine under audit is its input error here)
        raise ValueError(f"sampler: raised {type(error).__name__} on sample {index} (seed {seed}): {error}") from error
    tokens = _token_ids(output)
    if tokens is None:
        raise ValueError(f"sampler: sample {index} returned {_described(output)}, not a list of token ids")
    if len(tokens) > max_new_tokens:
        raise ValueError(f"sampler: sample {index} returned {len(tokens)} tokens, more than max_new_tokens "
                         f"({max_new_tokens})")
    outside = [token for token in tokens if not 0 <= token < vocab]
    if outside:
        raise ValueError(f"sampler: sample {index} returned token id {outside[0]}, outside the reference's vocabulary "
                         f"[0, {vocab}): the reference must be the sampler's model")
    return tokens
