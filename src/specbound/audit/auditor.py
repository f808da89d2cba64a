"""``audit``: does a speculative engine sample from its target's law? (SPEC.md §0: lossless
means the emitted tokens have the target's law under the sampling settings.)

The engine under audit is a ``sampler(prompt_ids, max_new_tokens, seed) -> list[int]`` (the
new tokens, EOS included where it stopped there); the reference is the same weights without
speculation (``audit.reference``). ``samples`` continuations are drawn, spread evenly over
the prompts (prompt-major order), each with its own seed from ``numpy.random.SeedSequence
(seed)``; every sampled token is scored by the reference by teacher forcing, its law made by
the engine's own ``engine.processing.Processing`` (temperature, top-k, top-p), and the three
tests of ``audit.pit`` are run: the pooled PIT test over every position, the shared-context
test (every prompt's first token, and any later context several samples reached) and the
sharpness test (every position, its noise scaled to the rows' uncertainty), at ``level``
together (Bonferroni: each at level/3). Under the null — the engine's law within
``tolerance`` in mean TV per position, within ``row_tolerance`` on one shared context's row,
and its mean log-probability score within ``sharpness_tolerance`` (its second moment within
``variance_tolerance``) of the reference's in aggregate — the audit fails with probability at
most ``level``.

``detectable_tv``: the per-position shift across the reference's probability ranking (a TV
at least as large) that the pooled test catches with probability ≥ 0.99 at this sample
count (``audit.pit.detectable_shift``), scaled up by the share of positions scored when
sequences end before ``max_new_tokens``. ``detectable_sharpening``: the error in temperature,
as a share (an engine sampling at T/(1 ± ε)), the sharpness test catches with probability
≥ 0.99 at this audit's rows (``audit.pit.detectable_sharpening``).

The default tolerances are the rounding of the reference's backend (``audit.tolerances``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from specbound.audit.pit import (ContextGroup, ContextTest, PooledTest, SharpnessTest, context_test,
                                 detectable_sharpening, detectable_shift, pit_values, pooled_test, sharpness_terms,
                                 sharpness_test, top_categories)
from specbound.audit.reference import as_reference
from specbound.audit.tolerances import tolerances_of
from specbound.checks import positive_int
from specbound.engine.processing import Processing

@dataclass(frozen=True)
class PositionStat:
    position: int  # 1 = the first new token
    scored: int  # samples that reached it
    p_value: float  # the pooled test on this position's values alone (not corrected for the positions)
    edge: float  # its worst edge
    fraction: float  # the share of values at or below that edge (edge itself under the null)


@dataclass
class AuditResult:
    passed: bool
    p_value: float  # Bonferroni of the three tests
    detectable_tv: float  # module docstring
    positions: list[PositionStat]  # by position
    level: float
    tolerance: float
    row_tolerance: float
    sharpness_tolerance: float
    variance_tolerance: float
    pooled: PooledTest
    shared: ContextTest
    sharpness: SharpnessTest
    detectable_sharpening: float  # module docstring
    pit: np.ndarray  # [samples, max_new_tokens] the PIT values, fresh uniforms after a sequence ended
    samples: list[dict]  # per sample: prompt (index), seed, tokens
    scored: int  # positions scored (the rest were past a sequence's end)
    seconds: dict[str, float] = field(default_factory=dict)  # "sampling", "scoring"

    def worst_positions(self, count: int = 5) -> list[PositionStat]:
        return sorted(self.positions, key=lambda stat: stat.p_value)[:count]


def audit(sampler: Callable[[list[int], int, int], list[int]], reference, prompts: Sequence[Sequence[int]], *,
          temperature: float, top_k: int = 0, top_p: float = 1.0, max_new_tokens: int, samples: int, seed: int = 0,
          level: float = 1e-3, tolerance: float | None = None, row_tolerance: float | None = None,
          sharpness_tolerance: float | None = None, variance_tolerance: float | None = None,
          vocab_size: int | None = None, on_sample: Callable[[int, dict], None] | None = None) -> AuditResult:
    """Audit ``sampler`` against ``reference`` (module docstring). ``top_k`` 0 and ``top_p``
    1 turn them off; a tolerance left None is the rounding of the reference's backend
    (``audit.tolerances``); ``vocab_size``: the logits kept (the tokenizer's size where the
    model's rows are padded; None keeps them all); ``on_sample(index, record)`` is told each
    sample as it is scored (progress, saving as it goes). ValueError naming the argument for
    bad input: prompts with ids outside the reference's vocabulary, a sampler that raises,
    returns something that is not token ids, more than ``max_new_tokens`` or ids outside the
    vocabulary."""
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
    tolerance, row_tolerance, sharpness_tolerance, variance_tolerance = (
        value if value is not None else default
        for value, default in zip(given.values(), tolerances_of(getattr(scorer, "backend", None))))
    vocab = vocab_size or scorer.vocab_size
    if vocab > scorer.vocab_size:
        raise ValueError(f"vocab_size: {vocab} exceeds the reference's {scorer.vocab_size} logits")
    prompts = _checked_prompts(prompts, vocab)
    seeds = np.random.SeedSequence(seed).generate_state(samples).tolist()
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    pit = rng.random((samples, max_new_tokens))  # PIT randomisation where scored, the values themselves past the end
    groups: dict[tuple, ContextGroup] = {}  # (prompt, tokens so far) -> its group
    records, seconds, scored = [], {"sampling": 0.0, "scoring": 0.0}, 0
    sharp = np.zeros(3)  # the sharpness test's ΣX, Σσ, Σσ²
    for index, prompt in enumerate(_prompt_order(len(prompts), samples)):
        started = time.perf_counter()
        tokens = _sampled(sampler, prompts[prompt], max_new_tokens, seeds[index], vocab, index)
        seconds["sampling"] += time.perf_counter() - started
        started = time.perf_counter()
        if tokens:
            probs = processing.probs(scorer.logits(prompts[prompt], tokens, room=max_new_tokens))  # [len, vocab]
            pit[index, : len(tokens)] = pit_values(probs, torch.tensor(tokens), torch.from_numpy(pit[index, : len(tokens)]))
            _join_groups(groups, prompt, tokens, *top_categories(probs))
            sharp += sharpness_terms(probs, torch.tensor(tokens))
            scored += len(tokens)
        seconds["scoring"] += time.perf_counter() - started
        record = {"index": index, "prompt": prompt, "seed": seeds[index], "tokens": tokens}
        records.append(record)
        if on_sample is not None:
            on_sample(index, record)
    pooled = pooled_test(pit, tolerance)
    shared = context_test(list(groups.values()), max_new_tokens, row_tolerance)
    sharpness = sharpness_test(*sharp, sharpness_tolerance, variance_tolerance)
    p_value = min(1.0, 3 * min(pooled.p_value, shared.p_value, sharpness.p_value))
    shift = detectable_shift(pit.size, tolerance, level / 3)
    detectable = shift * pit.size / scored if scored else math.inf
    positions = []
    for column in range(max_new_tokens):
        test = pooled_test(pit[:, column], tolerance)
        reached = sum(1 for record in records if len(record["tokens"]) > column)
        positions.append(PositionStat(column + 1, reached, test.p_value, test.edge, test.fraction))
    return AuditResult(p_value > level, p_value, detectable, positions, level, tolerance, row_tolerance,
                       sharpness_tolerance, variance_tolerance, pooled, shared, sharpness,
                       detectable_sharpening(sharp[1], sharp[2], sharpness_tolerance, variance_tolerance, level / 3),
                       pit, records, scored, seconds)


def _join_groups(groups: dict, prompt: int, tokens: list[int], top_tokens: torch.Tensor,
                 top_masses: torch.Tensor) -> None:
    """Count each of a sample's tokens in the group of its context, the group made (with the
    reference's categories there) by the first sample that reaches it.  # [len, K] x2"""
    for position, token in enumerate(tokens):
        key = (prompt, tuple(tokens[:position]))
        if key not in groups:
            groups[key] = ContextGroup(prompt, position + 1, top_tokens[position].tolist(),
                                       top_masses[position].tolist())
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


def _sampled(sampler, prompt: list[int], max_new_tokens: int, seed: int, vocab: int, index: int) -> list[int]:
    """The sampler's tokens for one sample, checked (ValueError naming ``sampler``)."""
    try:
        output = sampler(list(prompt), max_new_tokens, seed)
    except Exception as error:  # noqa: BLE001 (any failure of the engine under audit is its input error here)
        raise ValueError(f"sampler: raised {type(error).__name__} on sample {index} (seed {seed}): {error}") from error
    tokens = _token_ids(output)
    if tokens is None:
        raise ValueError(f"sampler: sample {index} returned {type(output).__name__}, not a list of token ids")
    if len(tokens) > max_new_tokens:
        raise ValueError(f"sampler: sample {index} returned {len(tokens)} tokens, more than max_new_tokens "
                         f"({max_new_tokens})")
    outside = [token for token in tokens if not 0 <= token < vocab]
    if outside:
        raise ValueError(f"sampler: sample {index} returned token id {outside[0]}, outside the reference's vocabulary "
                         f"[0, {vocab}): the reference must be the sampler's model")
    return tokens
