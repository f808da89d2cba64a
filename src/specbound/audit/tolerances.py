"""How far a correct engine's next-token laws may differ from the reference's by rounding:
measured on the audited model and contexts, not read from a table.

Kernels are not batch-invariant: a row scored alone and the same row scored inside a k-row
forward differ by rounding. A speculative engine scores its rows in k-row forwards and the
reference scores them otherwise, so a correct engine's law at a position lies within such a
difference of the reference's. The auditor measures it: every sampled continuation is scored
again at ``SHAPES`` — one row a forward (plain decoding) and four rows a forward (a chain of
three drafts verified), the first row by the prompt prefilled without its last token and that
token scored alone (``audit.reference``) — and at every scored position t it takes

- d_t: the largest TV between the processed law at another shape and the reference's;
- the sharpness test's terms (``audit.pit``): a_t, the largest |E'[X_t]|, and v_t, the largest
  excess E'[X_t²] − σ_t² (at least 0), E' under the row at another shape.

**The null it tolerates (margin M = ``MARGIN``, floor ε = ``ROUNDING_FLOOR``).** Along every
path, the engine's conditional laws lie within M times the reference's own disagreement: in
aggregate, Σ_t TV(engine_t, reference_t) ≤ M·Σ d_t + ε·n, Σ|E_engine[X_t]| ≤ M·Σ a_t + ε·Σσ_t
and Σ E_engine[X_t²] ≤ Σσ_t² + M·Σ v_t + ε·Σσ_t², n the positions scored; and at a context
several samples reach, TV ≤ M·d + ε at its row. (M covers the engine's batch shapes being
others than the two measured — 2, 3 or 8 rows a forward — whose rounding is of the same
kind: d_t is the larger of two shapes' disagreements, so M·d_t is about twice one shape's
on the embedded Q4_K_M pair, ``benchmarks/results/audit/rounding.json``; ε the float32
arithmetic of the processing itself, which no batch shape changes.) The
audit's tolerances are then exactly these (``measured``): the pooled test's mean per-position
TV δ = (M·Σ d_t + ε·n)/N over its N values (the positions past a sequence's end are exact
uniforms), each shared context's row tolerance M·d + ε, the sharpness test's κ = M·Σa_t/Σσ_t +
ε and ν = M·Σv_t/Σσ_t² + ε. Every scored position is measured, so these sums are not
estimated: the three tests' proofs (``audit.pit``) hold with tolerances computed from the
path, and the audit's false-alarm rate under this null is at most its level, with no share
of the level spent on the measurement. It costs one forward per token and one per four
(``AuditResult.seconds["measuring"]``).

A tolerance given explicitly replaces its measured one. A reference with no batch shapes to
measure (one that scores otherwise: a table in the tests) gets the rounding of the backend it
runs on where it names one (``engine.backends.Rounding``, measured on the default pair by
``benchmarks/audit/bench_audit_rounding.py``), else the widest any backend states:
``TOLERANCE``, ``ROW_TOLERANCE``, ``SHARPNESS_TOLERANCE`` and ``VARIANCE_TOLERANCE``. No
torch is imported here: the command line reads these for its help.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TOLERANCE = 0.015
ROW_TOLERANCE = 0.1
SHARPNESS_TOLERANCE = 0.04
VARIANCE_TOLERANCE = 0.05
SHAPES = (1, 4)  # rows a forward at which the auditor scores every continuation again
MARGIN = 1.5  # M: how many times the reference's own disagreement a correct engine's rows may lie off
ROUNDING_FLOOR = 1e-4  # ε: added to every measured tolerance


@dataclass
class MeasuredRounding:
    """How the audit's tolerances were set (module docstring): ``measured`` True where every
    scored row was scored again at ``shapes`` (rows a forward); ``rows`` the rows measured;
    ``mean_tv``, ``max_tv``: of d_t over them; ``score_drift`` = Σa_t/Σσ_t and
    ``score_variance`` = Σv_t/Σσ_t², before the margin; ``given``: the tolerances passed
    explicitly, which replace the measured ones."""

    measured: bool
    shapes: list[int] = field(default_factory=list)
    rows: int = 0
    mean_tv: float = 0.0
    max_tv: float = 0.0
    score_drift: float = 0.0
    score_variance: float = 0.0
    margin: float = MARGIN
    floor: float = ROUNDING_FLOOR
    given: list[str] = field(default_factory=list)


def tolerances_of(backend) -> tuple[float, float, float, float]:
    """(tolerance, row_tolerance, sharpness_tolerance, variance_tolerance) for a reference on
    ``backend``'s kernels that has no batch shapes to measure (None: the widest)."""
    if backend is None:
        return TOLERANCE, ROW_TOLERANCE, SHARPNESS_TOLERANCE, VARIANCE_TOLERANCE
    rounding = backend.rounding
    return rounding.mean_tv, rounding.row_tv, rounding.score_drift, rounding.score_variance
