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

The registry is filled on first use of these names (``from specbound.studies import
STUDIES``): importing a light module of the package (``options``: every study's name, help,
options and presets, which ``specbound study`` parses with; ``cluster``, ``records``;
``exact_part``, which the acceptance study's worker processes import) does not import the
studies, and with them torch.
"""

__all__ = ["STUDIES", "Study", "get_study", "register_study"]


def __getattr__(name):
    """``STUDIES``, ``Study``, ``get_study``, ``register_study`` (``base``), every study registered."""
    if name not in __all__:
        raise AttributeError(f"module 'specbound.studies' has no attribute {name!r}")
    from specbound.studies import acceptance, bias, multistep, rejections  # noqa: F401  (registration)
    from specbound.studies import base

    return getattr(base, name)
