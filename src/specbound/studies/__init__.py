"""Studies: rerun the papers' experiments on a real (target, draft) model pair (SPEC §5).

- ``acceptance``: [HU]'s exact per-position acceptance of every method and the optimum α*;
- ``rejections``: [YIN]'s predicted vs the engine's measured rejections (Thm 1, Thm 3);
- ``bias``: [YIN]'s Decoding-OPT vs Decoding-UNO, exact per-token bias and speed.

Shared pieces: ``pair`` (the models), ``traces`` (a generation and the exact rows along it),
``trace_theory`` (Yin's cost along one trace), ``runner`` and ``records`` (resumable
append-only results), ``statistics`` (per-token means, standard errors over prompts),
``tables``, ``figures`` and ``report``.
"""
