"""How far a correct engine's next-token laws may differ from the reference's by rounding.

Kernels are not batch-invariant: a row scored alone and the same row scored inside a k-row
forward differ by rounding. A speculative engine scores its rows in k-row forwards and the
reference scores them otherwise, so a correct engine's law at a position lies within such a
difference of the reference's. Each backend states how far its kernels' rows differ
(``engine.backends.Rounding``, measured by ``benchmarks/bench_audit_rounding.py``); the
audit tolerates that much:

- ``tolerance``: the mean per-position TV the pooled test allows (``Rounding.mean_tv``);
- ``row_tolerance``: one row's TV the shared-context test allows (``Rounding.row_tv``).

A reference whose kernels no backend names (a table, a model of another library) gets the
widest: ``TOLERANCE`` and ``ROW_TOLERANCE``, the largest any backend states
(a test holds them so). No torch is imported here: the command line reads these for its help.
"""

from __future__ import annotations

TOLERANCE = 0.015
ROW_TOLERANCE = 0.1


def tolerances_of(backend) -> tuple[float, float]:
    """(tolerance, row_tolerance) for a reference on ``backend``'s kernels (None: the widest)."""
    if backend is None:
        return TOLERANCE, ROW_TOLERANCE
    return backend.rounding.mean_tv, backend.rounding.row_tv
