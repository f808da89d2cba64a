"""Every lossless verifier's exact acceptance next to the optimum α* of its draft scheme
(SPEC.md §4.2-§4.3), for one (target, draft) pair: the numbers of ``specbound accept`` and
``specbound bounds``. Verifiers and schemes come from their registries."""

from __future__ import annotations

import sys

import numpy as np
from tqdm import tqdm

from specbound.checks import positive_int
from specbound.drafts import DRAFT_SCHEMES
from specbound.probability import as_target_and_draft
from specbound.verifiers import VERIFIERS

GAP_NOISE = 1e-9  # the LP verifier's optimum is exact to HiGHS' 1e-10 tolerances


def lossless_verifiers() -> list:
    """One instance of every registered lossless per-node verifier, default parameters
    (the verifiers of a whole drafted tree have no one-step acceptance)."""
    return [verifier_class() for verifier_class in VERIFIERS.values()
            if verifier_class.lossless and verifier_class.per_node]


def _value_or_reason(compute) -> tuple[float | None, str]:
    try:
        return float(compute()[0]), ""
    except ValueError as error:
        return None, str(error)


def acceptance_table(target_probs, draft_probs, num_drafts: int) -> list[dict]:
    """One record per method: α* of every draft scheme at n = ``num_drafts``, then every
    lossless verifier at its own count (``Verifier.default_num_drafts``: the single draft
    at 1, SpecHub at 2) with its exact acceptance, its scheme's α* at that count and the
    gap. A method that does not apply (too few distinct draft tokens, the LP verifier
    above its size limit) gets acceptance None and the reason. One (target, draft) row.
    """
    target, draft = as_target_and_draft(target_probs, draft_probs)
    records = []
    for name, scheme in DRAFT_SCHEMES.items():
        value, note = _value_or_reason(lambda: scheme.optimum(target, draft, num_drafts).acceptance)
        records.append({"method": f"optimal α* ({name})", "scheme": name, "num_drafts": num_drafts,
                        "acceptance": value, "optimum": value, "gap": None if value is None else 0.0,
                        "note": note})
    for verifier in lossless_verifiers():
        drafts = verifier.default_num_drafts(num_drafts)
        rate, note = _value_or_reason(lambda: verifier.acceptance_rate(target, draft, drafts))
        best, _ = _value_or_reason(lambda: verifier.optimum(target, draft, drafts))
        gap = None if rate is None or best is None else best - rate
        if gap is not None and abs(gap) <= GAP_NOISE:
            gap = 0.0
        records.append({"method": verifier.name, "scheme": verifier.scheme, "num_drafts": drafts,
                        "acceptance": rate, "optimum": best, "gap": gap, "note": note})
    return records


def optimum_with_certificate(target_probs, draft_probs, num_drafts: int) -> list[dict]:
    """α*, the subset H* and its target mass p(H*) for each draft scheme at n (1 − α* =
    Q(H*) − p(H*)); None with the reason where the scheme does not apply at this n."""
    target, draft = as_target_and_draft(target_probs, draft_probs)
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
    """α* per scheme and each lossless verifier's exact acceptance for n = 1..max_drafts
    (None where a method does not apply at that n, e.g. SpecHub for n ≠ 2, or the LP
    verifier above its size limit). ``progress`` shows a bar on stderr."""
    positive_int("max_drafts", max_drafts)
    target, draft = as_target_and_draft(target_probs, draft_probs)
    drafts = list(range(1, max_drafts + 1))

    def curve(rate_at):
        return [_value_or_reason(lambda: rate_at(n))[0] for n in drafts]

    optimum = {name: curve(lambda n, scheme=scheme: scheme.optimum(target, draft, n).acceptance)
               for name, scheme in DRAFT_SCHEMES.items()}
    verifiers = {}
    for verifier in tqdm(lossless_verifiers(), desc="verifiers", file=sys.stderr, disable=not progress):
        verifiers[verifier.name] = {
            "scheme": verifier.scheme,
            "acceptance": curve(lambda n, verifier=verifier: verifier.acceptance_rate(target, draft, n)),
        }
    return {"target": target[0].tolist(), "draft": draft[0].tolist(), "num_drafts": drafts,
            "optimum": optimum, "verifiers": verifiers}
