"""Every lossless verifier's exact acceptance next to the optimum α* of its draft scheme
(SPEC.md §4.2-§4.3), for (target, draft) pairs: the numbers of ``specbound accept`` and
``specbound bounds``. Verifiers and schemes come from their registries.

Inputs may be a batch of rows; every row gets its own records. Before anything runs, the
work of all rows and every number of drafts asked for is estimated (``work_seconds``, from
per-operation costs kept as constants in ``specbound.work_limits``, not measured on the
machine that runs) and refused with ``checks.WorkLimitError`` beyond
``TABLE_SECONDS_LIMIT`` (or the number of seconds in the environment variable
``SPECBOUND_WORK_LIMIT_SECONDS``): the α* scans and the
n-step products grow with n·V, the exponential race of α* without replacement with
n²·V, and the exact RRS-without-replacement acceptance and the LP verifier say what they
cost themselves (``verifiers.rrs_exact``, ``bounds.coupling``). Where those two are above
their own limits the method is reported as not applicable, with the reason; where the
n = 3 RRS-without-replacement bracket could not close within its limit, the value is the
bracket's midpoint and the note gives the bracket.
"""

from __future__ import annotations

import math
import sys
import warnings

import numpy as np
from tqdm import tqdm

from specbound.bounds.coupling import LP_SECONDS_LIMIT, MAX_LP_VARIABLES, lp_seconds
from specbound.checks import WORK_SECONDS_VARIABLE, positive_int, within_work_limit
from specbound.drafts import DRAFT_SCHEMES
from specbound.probability import as_target_and_draft, support_size
from specbound.verifiers import VERIFIERS
from specbound.verifiers.rrs_exact import (
    RECURSION_SECONDS_LIMIT,
    BracketWarning,
    recursion_seconds,
    three_draft_seconds,
)
from specbound.work_limits import (
    RACE_SECONDS_PER_DRAFT_TOKEN,
    TABLE_SECONDS_PER_DRAFT,
    TABLE_SECONDS_PER_DRAFT_TOKEN,
    TABLE_SECONDS_PER_TOKEN,
)

GAP_NOISE = 1e-9  # the LP verifier's optimum is exact to HiGHS' 1e-10 tolerances
TABLE_SECONDS_LIMIT = 30.0


def lossless_verifiers() -> list:
    """One instance of every registered lossless per-node verifier, default parameters
    (the verifiers of a whole drafted tree have no one-step acceptance)."""
    return [verifier_class() for verifier_class in VERIFIERS.values()
            if verifier_class.lossless and verifier_class.per_node]


def work_seconds(target, draft, counts: list | range) -> float:
    """Estimated seconds of every α* and lossless verifier at each n of ``counts`` (sorted:
    a list or a range) for all rows of the checked ``target``/``draft`` [batch, vocab]
    (module docstring). Beyond the draft support and the LP's reach only the n-step
    products grow, linearly in n, and are summed in closed form; below, the sum stops
    counting at a thousand times ``TABLE_SECONDS_LIMIT`` (the answer is no either way)."""
    rows, vocab_size = target.shape
    support = int(support_size(draft).max())
    rejectable = np.count_nonzero(draft > target, axis=1)
    lp_reach = 64 if support == 1 else math.log(MAX_LP_VARIABLES / vocab_size) / math.log(support)
    per_draft = TABLE_SECONDS_PER_DRAFT + TABLE_SECONDS_PER_DRAFT_TOKEN * vocab_size
    total = 0.0
    head, tail_count, tail_sum = _split_counts(counts, math.floor(max(support, lp_reach)))
    for num_drafts in head:
        per_row = TABLE_SECONDS_PER_TOKEN * vocab_size + num_drafts * per_draft + _lp_seconds(support, vocab_size, num_drafts)
        if 3 <= num_drafts <= support:
            per_row += RACE_SECONDS_PER_DRAFT_TOKEN * num_drafts * (1 + num_drafts / 40) * (vocab_size + 2000)
        total += rows * per_row
        if num_drafts == 3:
            total += sum(three_draft_seconds(t, d) for t, d in zip(target, draft))
        elif 4 <= num_drafts <= support:
            recursion = np.array([recursion_seconds(r, vocab_size, num_drafts) for r in rejectable])
            total += float(recursion[recursion <= RECURSION_SECONDS_LIMIT].sum())  # the rest is refused at once
        if total > 1000 * TABLE_SECONDS_LIMIT:
            return total
    fixed = TABLE_SECONDS_PER_TOKEN * vocab_size + (_lp_seconds(1, vocab_size, 1) if support == 1 else 0.0)
    return total + rows * (tail_count * fixed + tail_sum * per_draft)


def _split_counts(counts: list | range, last: int) -> tuple[list | range, int, int]:
    """The counts up to ``last``, and the number and sum of the others (a range in closed
    form, whatever its length)."""
    if isinstance(counts, range):  # step 1, ascending
        head = range(counts.start, max(counts.start, min(counts.stop, last + 1)))
        first, stop = max(counts.start, last + 1), counts.stop
        count = max(0, stop - first)
        return head, count, count * (first + stop - 1) // 2
    head = [n for n in counts if n <= last]
    tail = [n for n in counts if n > last]
    return head, len(tail), sum(tail)


def _lp_seconds(support: int, vocab_size: int, num_drafts: int) -> float:
    """The LP verifier's solve (its joint law with replacement has support^n tuples); 0
    where it is above its limits and refused at once."""
    if num_drafts * math.log(max(support, 1)) + math.log(vocab_size) > math.log(MAX_LP_VARIABLES):
        return 0.0
    seconds = lp_seconds(support**num_drafts, vocab_size)
    return seconds if seconds <= LP_SECONDS_LIMIT else 0.0


def check_work(target, draft, counts: list | range, name: str) -> None:
    """WorkLimitError naming ``name`` when ``work_seconds`` is above ``TABLE_SECONDS_LIMIT``
    (or the limit ``checks.WORK_SECONDS_VARIABLE`` sets)."""
    largest = counts.stop - 1 if isinstance(counts, range) else counts[-1]  # len() of a huge range overflows
    within_work_limit(f"{name} (n up to {largest:,}, V = {target.shape[1]:,}, {target.shape[0]:,} row(s))",
                      work_seconds(target, draft, counts), TABLE_SECONDS_LIMIT, WORK_SECONDS_VARIABLE, "s",
                      hint="fewer drafts, rows or tokens")


def _value_or_reason(compute) -> tuple[float | None, str]:
    """(value, note) of a one-row computation: None and the reason where it does not
    apply; the bracket where the value is a certified bracket's midpoint."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", BracketWarning)
        try:
            value = float(compute()[0])
        except ValueError as error:
            return None, str(error)
    notes = [str(warning.message) for warning in caught if issubclass(warning.category, BracketWarning)]
    return value, "; ".join(notes)


def acceptance_table(target_probs, draft_probs, num_drafts: int) -> list[list[dict]]:
    """One list of records per row, one record per method: α* of every draft scheme at
    n = ``num_drafts``, then every lossless verifier at its own count
    (``Verifier.default_num_drafts``: the single draft at 1, SpecHub at 2) with its exact
    acceptance, its scheme's α* at that count and the gap. A method that does not apply
    (too few distinct draft tokens, the LP verifier above its size limit) gets acceptance
    None and the reason in its note.
    """
    positive_int("num_drafts", num_drafts)
    target, draft = as_target_and_draft(target_probs, draft_probs)
    verifiers = lossless_verifiers()
    counts = sorted({num_drafts} | {verifier.default_num_drafts(num_drafts) for verifier in verifiers})
    check_work(target, draft, counts, "num_drafts")
    return [_row_table(target[row:row + 1], draft[row:row + 1], num_drafts, verifiers) for row in range(len(target))]


def restricted_draft(target_probs, draft_probs, shared) -> tuple[np.ndarray, np.ndarray]:
    """A draft with another tokenizer (TLI, ``engine.vocabulary``): the draft law restricted
    to the token indices ``shared`` (the tokens both vocabularies share) and renormalised,
    q_S = q·1_S / q(S) — the engine's restriction of the draft's logits at temperature 1 —
    and the bound p(S) on every verifier's acceptance and on α* for q_S, per row (a single
    row against a batch broadcast). ValueError naming ``shared`` for an index outside the
    vocabulary or a row whose draft puts no mass on S.  # -> [rows, vocab], [rows]"""
    target, draft = as_target_and_draft(target_probs, draft_probs)
    indices = np.asarray(shared)
    if indices.ndim != 1 or not indices.size or not np.issubdtype(indices.dtype, np.integer) \
            or indices.min() < 0 or indices.max() >= target.shape[1]:
        raise ValueError(f"shared: expected token indices in [0, {target.shape[1]}), got {np.ravel(shared).tolist()}")
    mask = np.zeros(target.shape[1], dtype=bool)
    mask[indices] = True
    kept = np.where(mask, draft, 0.0)
    mass = kept.sum(axis=1, keepdims=True)
    if (mass <= 0).any():
        raise ValueError(f"shared: the draft puts no mass on the shared tokens in row {int(np.argmin(mass[:, 0]))}")
    return kept / mass, target[:, mask].sum(axis=1)


def _row_table(target, draft, num_drafts, verifiers) -> list[dict]:
    records = []
    for name, scheme in DRAFT_SCHEMES.items():
        value, note = _value_or_reason(lambda: scheme.optimum(target, draft, num_drafts).acceptance)
        records.append({"method": f"optimal α* ({name})", "scheme": name, "num_drafts": num_drafts,
                        "acceptance": value, "optimum": value, "gap": None if value is None else 0.0,
                        "note": note})
    for verifier in verifiers:
        drafts = verifier.default_num_drafts(num_drafts)
        rate, note = _value_or_reason(lambda: verifier.acceptance_rate(target, draft, drafts))
        best, _ = _value_or_reason(lambda: verifier.optimum(target, draft, drafts))
        gap = None if rate is None or best is None else best - rate
        if gap is not None and abs(gap) <= GAP_NOISE:
            gap = 0.0
        records.append({"method": verifier.name, "scheme": verifier.scheme, "num_drafts": drafts,
                        "acceptance": rate, "optimum": best, "gap": gap, "note": note})
    return records


def optimum_with_certificate(target_probs, draft_probs, num_drafts: int) -> list[list[dict]]:
    """Per row, α*, the subset H* and its target mass p(H*) for each draft scheme at n
    (1 − α* = Q(H*) − p(H*)); None with the reason where the scheme does not apply at this n."""
    positive_int("num_drafts", num_drafts)
    target, draft = as_target_and_draft(target_probs, draft_probs)
    check_work(target, draft, [num_drafts], "num_drafts")
    return [_row_optimum(target[row:row + 1], draft[row:row + 1], num_drafts) for row in range(len(target))]


def _row_optimum(target, draft, num_drafts) -> list[dict]:
    records = []
    for name, scheme in DRAFT_SCHEMES.items():
        try:
            result = scheme.optimum(target, draft, num_drafts)
        except ValueError as error:
            records.append({"scheme": name, "acceptance": None, "subset": None, "note": str(error)})
            continue
        records.append({
            "scheme": name,
            "acceptance": float(result.acceptance[0]),
            "subset": np.flatnonzero(result.optimal_subset[0]).tolist(),
            "target_mass_of_subset": float(target[0, result.optimal_subset[0]].sum()),
            "note": "",
        })
    return records


def acceptance_vs_drafts(target_probs, draft_probs, max_drafts: int, progress: bool = False) -> dict:
    """α* per scheme and each lossless verifier's exact acceptance for n = 1..max_drafts,
    for one (target, draft) pair (None where a method does not apply at that n, e.g.
    SpecHub for n ≠ 2, or the LP verifier above its size limit; ``notes`` only where a
    value is a bracket's midpoint). ``progress`` shows a bar on stderr."""
    positive_int("max_drafts", max_drafts)
    target, draft = as_target_and_draft(target_probs, draft_probs)
    if target.shape[0] != 1:
        raise ValueError(f"target_probs: bounds plot draws one (target, draft) pair, got a batch of "
                         f"{target.shape[0]} rows (specbound accept and bounds optimum report every row)")
    check_work(target, draft, range(1, max_drafts + 1), "max_drafts")
    drafts = list(range(1, max_drafts + 1))
    notes = {}

    def curve(label, rate_at):
        values = []
        for n in drafts:
            value, note = _value_or_reason(lambda: rate_at(n))
            values.append(value)
            if value is not None and note:
                notes[f"{label}, n = {n}"] = note
        return values

    optimum = {name: curve(f"α* {name}", lambda n, scheme=scheme: scheme.optimum(target, draft, n).acceptance)
               for name, scheme in DRAFT_SCHEMES.items()}
    verifiers = {}
    for verifier in tqdm(lossless_verifiers(), desc="verifiers", file=sys.stderr, disable=not progress):
        verifiers[verifier.name] = {
            "scheme": verifier.scheme,
            "acceptance": curve(verifier.name, lambda n, verifier=verifier: verifier.acceptance_rate(target, draft, n)),
        }
    numbers = {"target": target[0].tolist(), "draft": draft[0].tolist(), "num_drafts": drafts,
               "optimum": optimum, "verifiers": verifiers}
    return {**numbers, "notes": notes} if notes else numbers
