"""Monte Carlo speculative decoding on Markov chains, vectorised over runs (SPEC.md §1, §2).

The simulator runs the algorithm itself, round by round, for many independent runs at once:
each round of a run drafts M i.i.d. continuations from the draft chain (to the horizon when
``lookahead`` is None — K = ∞, as in [YIN] — or γ tokens otherwise), makes one target call,
verifies the round's first position (the root) by recursive rejection over the M root tokens
[YIN Alg. 4], then the accepted draft by plain speculative sampling until its first
rejection, which emits a residual token and ends the round. With a finite lookahead a round
whose γ drafted tokens were all accepted emits a bonus token from the target. M = 1 is
single-draft speculative sampling [LEV].

Counts match ``specbound.chains.theory``: ``rejections`` = rounds that ended with a residual
token (the paper's N_rej), ``target_calls`` = rounds. Letters: p = target, q = draft.

Work: at most T rounds per run, each drafting up to L = min(γ, T) tokens (at most what is
left of the horizon) along M drafts from rows of V states, so time grows as runs·M·T·L·V
and memory as runs·M·(L + V) (the drafts
and the rows sampled from at one offset). ``simulation_seconds`` and ``simulation_bytes``
estimate both (per-operation costs from ``specbound.work_limits``); a
simulation beyond ``SIMULATION_SECONDS_LIMIT`` or ``SIMULATION_BYTES_LIMIT`` is refused
with ``checks.WorkLimitError`` before it starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from specbound.chains.theory import MarkovChainPair, check_lookahead, check_num_drafts
from specbound.checks import positive_int, within_limit
from specbound.probability import residual, sample_from
from specbound.work_limits import SIMULATION_SECONDS_PER_DRAFTED_ENTRY, SIMULATION_SECONDS_PER_ROUND

SIMULATION_SECONDS_LIMIT = 30.0
SIMULATION_BYTES_LIMIT = 2 * 2**30
BYTES_PER_DRAFT_ENTRY = 8 * 4  # int64 drafts, float64 rows and sample_from's temporaries


def simulation_seconds(num_runs: int, horizon: int, vocab_size: int, num_drafts: int = 1,
                       lookahead: int | None = None) -> float:
    """Estimated seconds of ``simulate_decoding``: a run drafts at most min(L, (T + 1)/2)
    tokens per position on average (each round drafts at most what is left of the horizon)."""
    drafted = min(horizon if lookahead is None else lookahead, (horizon + 1) / 2)
    return num_runs * horizon * num_drafts * (
        SIMULATION_SECONDS_PER_DRAFTED_ENTRY * drafted * (vocab_size + 8)
        + SIMULATION_SECONDS_PER_ROUND * (1 + 8 / num_drafts))


def simulation_bytes(num_runs: int, horizon: int, vocab_size: int, num_drafts: int = 1,
                     lookahead: int | None = None) -> float:
    """Peak bytes of ``simulate_decoding``: the drafts, the rows of one offset, the tokens."""
    drafted = horizon if lookahead is None else min(lookahead, horizon)
    return num_runs * (BYTES_PER_DRAFT_ENTRY * num_drafts * (drafted + vocab_size) + 8 * (horizon + 4 * vocab_size))


@dataclass(frozen=True)
class SimulatedDecoding:
    """Per-run results of ``simulate_decoding``."""

    prompt_tokens: np.ndarray  # [runs], x_0
    sequences: np.ndarray  # [runs, horizon], x_1..x_T
    rejections: np.ndarray  # [runs], N_rej
    target_calls: np.ndarray  # [runs], rounds


def simulate_decoding(
    chain: MarkovChainPair,
    num_runs: int,
    rng: np.random.Generator,
    num_drafts: int = 1,
    lookahead: int | None = None,
) -> SimulatedDecoding:
    """Decode the horizon ``num_runs`` times; ``lookahead=None`` drafts to the horizon."""
    check_num_drafts(num_drafts)
    if num_drafts == math.inf:
        raise ValueError("num_drafts: a simulation needs a finite number of drafts")
    check_lookahead(lookahead)
    positive_int("num_runs", num_runs)
    sizes = (num_runs, chain.horizon, chain.vocab_size, num_drafts, lookahead)
    name = f"num_runs × num_drafts (runs = {num_runs:,}, M = {num_drafts:,}, T = {chain.horizon:,}, V = {chain.vocab_size:,})"
    within_limit(name, simulation_seconds(*sizes), SIMULATION_SECONDS_LIMIT, "s", hint="fewer runs or drafts")
    within_limit(name, simulation_bytes(*sizes), SIMULATION_BYTES_LIMIT, "bytes", hint="fewer runs or drafts")
    horizon = chain.horizon
    tokens = np.empty((num_runs, horizon + 1), dtype=np.int64)  # column t holds x_t
    tokens[:, 0] = sample_from(
        np.broadcast_to(chain.prompt_probs, (num_runs, chain.vocab_size)), rng.random(num_runs)
    )
    next_position = np.ones(num_runs, dtype=np.int64)  # first position not yet emitted
    rejections = np.zeros(num_runs, dtype=np.int64)
    target_calls = np.zeros(num_runs, dtype=np.int64)
    while True:
        runs = np.flatnonzero(next_position <= horizon)
        if runs.size == 0:
            break
        target_calls[runs] += 1
        last_emitted, rejected = _decode_round(
            chain, tokens, runs, next_position[runs], num_drafts, min(lookahead or horizon, horizon), rng
        )
        next_position[runs] = last_emitted + 1
        rejections[runs] += rejected
    return SimulatedDecoding(tokens[:, 0], tokens[:, 1:], rejections, target_calls)


def _decode_round(chain, tokens, runs, start, num_drafts, lookahead, rng):
    """One round for ``runs``, writing its output into ``tokens`` [all runs, T + 1].

    start [runs] is the round's root position. Returns (last position emitted, rejected).
    """
    horizon = chain.horizon
    lengths = np.minimum(lookahead, horizon - start + 1)  # drafted tokens this round
    drafts = _draft_continuations(chain, tokens[runs, start - 1], start, lengths, num_drafts, rng)
    last_emitted = start + lengths - 1
    rejected = np.zeros(runs.size, dtype=bool)

    # Root: recursive rejection over the M root tokens, residual p^{m+1} = norm((p^m − q)+).
    previous = tokens[runs, start - 1]
    residual_law = chain.target_transitions[start - 1, previous]  # p^m, [runs, V]
    draft_law = chain.draft_transitions[start - 1, previous]  # q, [runs, V]
    chosen = np.full(runs.size, -1)  # index of the accepted draft, -1 while none
    for draft_index in range(num_drafts):
        open_runs = np.flatnonzero(chosen < 0)
        root_token = drafts[open_runs, draft_index, 0]
        ratio = residual_law[open_runs, root_token] / draft_law[open_runs, root_token]
        accept = rng.random(open_runs.size) < ratio
        chosen[open_runs[accept]] = draft_index
        failed = open_runs[~accept]
        residual_law[failed] = residual(residual_law[failed], draft_law[failed])
    failed = np.flatnonzero(chosen < 0)
    tokens[runs[failed], start[failed]] = sample_from(residual_law[failed], rng.random(failed.size))
    rejected[failed] = True
    last_emitted[failed] = start[failed]

    # Along the accepted draft: plain speculative sampling until the first rejection.
    live = np.flatnonzero(chosen >= 0)  # indices into runs
    tokens[runs[live], start[live]] = drafts[live, chosen[live], 0]
    for offset in range(1, drafts.shape[2]):
        live = live[offset < lengths[live]]
        position = start[live] + offset
        previous = tokens[runs[live], position - 1]
        target_law = chain.target_transitions[position - 1, previous]  # [live, V]
        draft_law = chain.draft_transitions[position - 1, previous]
        proposed = drafts[live, chosen[live], offset]
        rows = np.arange(live.size)
        accept = rng.random(live.size) < target_law[rows, proposed] / draft_law[rows, proposed]
        tokens[runs[live[accept]], position[accept]] = proposed[accept]
        miss = ~accept
        tokens[runs[live[miss]], position[miss]] = sample_from(
            residual(target_law[miss], draft_law[miss]), rng.random(int(miss.sum()))
        )
        rejected[live[miss]] = True
        last_emitted[live[miss]] = position[miss]
        live = live[accept]

    # Bonus token from the target after γ accepted tokens, when the horizon allows.
    live = live[last_emitted[live] < horizon]
    position = last_emitted[live] + 1
    tokens[runs[live], position] = sample_from(
        chain.target_transitions[position - 1, tokens[runs[live], position - 1]],
        rng.random(live.size),
    )
    last_emitted[live] = position
    return last_emitted, rejected.astype(np.int64)


def _draft_continuations(chain, previous, start, lengths, num_drafts, rng):
    """M i.i.d. draft continuations per run from the draft chain; -1 past a run's length.

    previous [runs] (x_{start-1}), start [runs], lengths [runs] -> [runs, M, max length]
    """
    drafts = np.full((previous.size, num_drafts, int(lengths.max())), -1, dtype=np.int64)
    last = np.repeat(previous[:, None], num_drafts, axis=1)  # [runs, M]
    for offset in range(drafts.shape[2]):
        live = np.flatnonzero(offset < lengths)
        position = np.repeat(start[live] + offset, num_drafts)
        rows = chain.draft_transitions[position - 1, last[live].reshape(-1)]  # [live·M, V]
        sampled = sample_from(rows, rng.random(rows.shape[0])).reshape(live.size, num_drafts)
        drafts[live, :, offset] = sampled
        last[live] = sampled
    return drafts
