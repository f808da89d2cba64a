"""How far a correct engine's next-token laws may differ from the reference's by rounding.

Kernels are not batch-invariant: a row scored alone and the same row scored inside a k-row
forward differ by rounding. A speculative engine scores its rows in k-row forwards and the
reference scores them otherwise, so a correct engine's law at a position lies within such a
difference of the reference's. Each backend states how far its kernels' rows differ
(``engine.backends.Rounding``, measured by ``benchmarks/bench_audit_rounding.py``); the
audit tolerates that much:

- ``tolerance``: the mean per-position TV the pooled test allows (``Rounding.mean_tv``);
- ``row_tolerance``: one row's TV the shared-context test allows (``Rounding.row_tv``);
- ``sharpness_tolerance``: the aggregate drift of the sharpness test's score, per unit of
  the rows' spread, it allows (``Rounding.score_drift``); ``variance_tolerance``: the excess
  of the score's second moment over the reference's variance (``Rounding.score_variance``).

A reference whose kernels no backend names (a table, a model of another library) gets the
widest: ``TOLERANCE``, ``ROW_TOLERANCE``, ``SHARPNESS_TOLERANCE`` and ``VARIANCE_TOLERANCE``,
the largest any backend states
(a test holds them so). No torch is imported here: the command line reads these for its help.
"""

from __future__ import annotations

TOLERANCE = 0.015
ROW_TOLERANCE = 0.1
SHARPNESS_TOLERANCE = 0.04
VARIANCE_TOLERANCE = 0.05


def tolerances_of(backend) -> tuple[float, float, float, float]:
    """(tolerance, row_tolerance, sharpness_tolerance, variance_tolerance) for a reference on
    ``backend``'s kernels (None: the widest)."""
    if backend is None:
        return TOLERANCE, ROW_TOLERANCE, SHARPNESS_TOLERANCE, VARIANCE_TOLERANCE
    rounding = backend.rounding
    return rounding.mean_tv, rounding.row_tv, rounding.score_drift, rounding.score_variance
