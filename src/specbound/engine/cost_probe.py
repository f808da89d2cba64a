"""Measuring what a forward costs on this machine: one engine forward of k new rows — a tree
of k children below a context of ``CONTEXT`` tokens, as the engine scores them — for k in
``costs.ROWS``, timed on the model's own backend, the minimum over ``REPEATS`` (the least
disturbed figure on a shared machine)."""

from __future__ import annotations

import time

import torch

from specbound.engine.backends import Entries, backend_of
from specbound.engine.costs import ROWS, Costs

CONTEXT = 200
REPEATS = 3


def measure_costs(model, rows=ROWS, context: int = CONTEXT, repeats: int = REPEATS) -> Costs:
    """Time one forward of k tree rows below a ``context``-token prefix, for each k, as the
    engine's target step runs it on the model's backend (``Backend.language_model``)."""
    lm = backend_of(model).language_model(model)
    generator = torch.Generator().manual_seed(0)
    vocab = min(lm.logits_size, 1000)
    lm.prefill(0, torch.randint(0, vocab, (context,), generator=generator).tolist())
    seconds = {}
    for count in rows:
        best = float("inf")
        for _ in range(repeats):
            tokens = torch.randint(0, vocab, (count,), generator=generator).tolist()
            entries = Entries.chain(tokens) if count == 1 else Entries(tokens, [-1] + [0] * (count - 1))
            _synchronize(lm.device)
            started = time.perf_counter()
            lm.score([entries], outputs=[range(count)]).logits(0, [0])
            _synchronize(lm.device)
            best = min(best, time.perf_counter() - started)
            lm.commit([[]])
        seconds[count] = best
    return Costs(seconds)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
