"""Studies: rerun the papers' experiments on a real (target, draft) model pair (SPEC.md §5).

The registry ``STUDIES`` (``base``) holds one class per study, each owning its options,
units, tables and report sections:
- ``acceptance``: [HU]'s exact per-position acceptance of every method and the optimum α*;
- ``rejections``: [YIN]'s predicted vs the engine's measured rejections (Thm 1, Thm 3);
- ``bias``: [YIN]'s Decoding-OPT vs Decoding-UNO, exact per-token bias and speed;
- ``multistep``: token-wise vs block vs traversal verification on the same drafted steps,
  and the multi-step optimum (SPEC.md §7).

The acceptance and multi-step studies keep their tables and report sections in their own
modules (``acceptance_report``, ``multistep_report``; the acceptance study's methods in
``acceptance_methods``). Shared pieces: ``traces`` (a generation and the exact rows along it), ``trace_theory``
(Yin's cost along one trace), ``runner`` and ``records`` (resumable append-only results, checked
as read against each study's ``fields``),
``document`` and ``report`` (the rendered report).
"""

from specbound.studies import acceptance, bias, multistep, rejections  # noqa: F401  (registration)
from specbound.studies.base import STUDIES, Study, get_study, register_study

__all__ = ["STUDIES", "Study", "get_study", "register_study"]
