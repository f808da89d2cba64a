"""The studies' checks of settings that span several options, without torch: each study's
constructor calls them (the Python API), and ``specbound study`` calls them through its
entry's ``check`` in ``options.STUDY_OPTIONS`` before the studies load. A size within one
option is checked as that option is parsed (``options``)."""

from __future__ import annotations

from specbound.engine.drafted import check_drafted


def check_some_configuration(gammas, trees, sparse, iid_trees=()) -> None:
    """Refuse a multi-step study without a single chain, tree or sparse tree to decode."""
    if not (gammas or trees or sparse or iid_trees):
        raise ValueError("gammas, trees, sparse: expected at least one configuration")


def drafted_lookahead(num_drafts: int, lookahead: int | None, horizon: int) -> int:
    """The lookahead γ of M = ``num_drafts`` drafts at ``lookahead`` over a fixed ``horizon``
    (the rejections study): a lookahead of None or beyond the horizon drafts to it (K = ∞).
    Refused, naming the setting that made it too large, where one target call would verify
    more drafted tokens than the engine does (``engine.drafted.check_drafted``)."""
    gamma = min(lookahead or horizon, horizon)
    try:
        check_drafted("chain" if num_drafts == 1 else "batch", None if num_drafts == 1 else num_drafts, gamma=gamma)
    except ValueError as error:
        if num_drafts > 1:
            fields = "batch_sizes, batch_lookahead"
        elif lookahead is None or lookahead >= horizon:
            fields = "max_new_tokens (the horizon of lookahead inf)"
        else:
            fields = "lookaheads"
        raise ValueError(f"{fields}: {error}") from None
    return gamma
