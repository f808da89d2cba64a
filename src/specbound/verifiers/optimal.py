"""The optimal-transport verifier (SPEC.md §4.3, [HU]): the coupling LP solved for one row.

For any draft scheme, solve the LP max P(y ∈ x̄) over couplings π(y, x̄) with marginals p
and D (``specbound.bounds.coupling``) and emit y ~ π(·|x̄). Lossless, and α = α*(p, D).
Only for small problems: the LP has |supp D|·V variables. Letters: p = target (SPEC.md §0).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from specbound.bounds import optimal_coupling
from specbound.drafts import get_draft_scheme
from specbound.probability import sample_from
from specbound.verifiers.base import Verifier, register_verifier


@functools.lru_cache(maxsize=256)
def _solved_coupling(target_bytes: bytes, draft_bytes: bytes, num_drafts: int, scheme: str):
    target_row = np.frombuffer(target_bytes)
    tuples, tuple_probs = get_draft_scheme(scheme).joint_law(np.frombuffer(draft_bytes), num_drafts,
                                                             lp_vocab_size=len(target_row))
    coupling, acceptance = optimal_coupling(target_row, tuples, tuple_probs)
    index = {tuple(row): k for k, row in enumerate(tuples.tolist())}
    return index, _conditionals(coupling, target_row), acceptance


def _conditionals(coupling: np.ndarray, target_row: np.ndarray) -> np.ndarray:
    """π(·|x̄_k): each row of the coupling divided by its own sum, not by D_k.

    The LP's marginals hold to an absolute tolerance, so coupling[k] / D_k of a tuple with
    D_k ~ 1e-12 is no law at all (its sum may be 0.9998). Normalising by the row's sum makes
    every conditional a law and moves the output law Σ_k D_k π(·|x̄_k) by at most
    Σ_k |D_k − Σ_y coupling[k, y]| in total variation, the LP's row-marginal residuals. A row
    the solver left empty (D_k below the tolerance) emits from p: its weight D_k bounds what
    that changes.
    # coupling [K, vocab], target_row [vocab] -> [K, vocab]
    """
    sums = coupling.sum(axis=1, keepdims=True)
    empty = sums[:, 0] <= 0
    conditionals = coupling / np.where(empty[:, None], 1.0, sums)
    conditionals[empty] = target_row
    return conditionals


@register_verifier
@dataclass(frozen=True)
class Optimal(Verifier):
    """The LP verifier for the draft scheme ``draft_scheme`` (module docstring)."""

    name = "optimal"
    label = "optimal verifier (LP)"
    scalable = False
    draft_scheme_name: str = "with_replacement"

    def __init__(self, draft_scheme: str = "with_replacement"):
        get_draft_scheme(draft_scheme)
        object.__setattr__(self, "draft_scheme_name", draft_scheme)

    @property
    def scheme(self) -> str:  # type: ignore[override]
        return self.draft_scheme_name

    def _rows(self, target, draft, num_drafts):
        for target_row, draft_row in zip(target, draft):
            yield _solved_coupling(target_row.tobytes(), draft_row.tobytes(), num_drafts, self.scheme)

    def _output_law(self, target, draft, tokens):
        laws = []
        for (index, conditional, _), draft_tuple in zip(self._rows(target, draft, tokens.shape[1]), tokens):
            key = tuple(draft_tuple.tolist())
            if key not in index:
                raise ValueError(f"draft_tokens: the {self.scheme} draft scheme never draws the tuple {key} "
                                 "from this draft row (probability 0)")
            laws.append(conditional[index[key]])
        return np.array(laws)

    def _verify(self, target, draft, tokens, uniforms):
        return sample_from(self._output_law(target, draft, tokens), uniforms[:, -1])

    def _acceptance_rate(self, target, draft, num_drafts):
        return np.array([acceptance for _, _, acceptance in self._rows(target, draft, num_drafts)])
