"""What a forward costs: seconds by the number of new rows it scores, and a prefill's seconds.

Speculative decoding pays when the target scores many rows for little more than one, and
the draft costs little: both are properties of the machine, the backend, the model and its
precision (on an AVX2-only CPU a bf16 torch forward costs time linear in its rows; with
AVX512-BF16, AMX or a GPU, 16 rows cost little more than one). ``Costs`` interpolates
between the row counts measured (``ROWS``: ``engine.cost_probe`` measures them, and
``engine.cost_book`` keeps them per machine, backend, model and precision);
``prefill_seconds`` predicts a long prefill from them.
"""

from __future__ import annotations

from dataclasses import dataclass

from specbound.engine.backends import PREFILL_CHUNK

ROWS = (1, 2, 4, 8, 16, 32)  # the row counts measured


@dataclass(frozen=True)
class Costs:
    """Seconds of one forward by the number of new rows it scores."""

    seconds: dict[int, float]  # rows -> seconds

    def __call__(self, rows: int) -> float:
        """Seconds for ``rows`` rows, linear between measured counts (and beyond the last)."""
        known = sorted(self.seconds)
        if rows <= known[0]:
            return self.seconds[known[0]]
        for low, high in zip(known, known[1:]):
            if rows <= high:
                fraction = (rows - low) / (high - low)
                return self.seconds[low] + fraction * (self.seconds[high] - self.seconds[low])
        low, high = known[-2], known[-1]
        return self.seconds[high] + (rows - high) * (self.seconds[high] - self.seconds[low]) / (high - low)

    def to_json(self) -> dict:
        return {str(rows): seconds for rows, seconds in self.seconds.items()}

    @classmethod
    def from_json(cls, payload: dict) -> Costs:
        return cls({int(rows): float(seconds) for rows, seconds in payload.items()})


def prefill_seconds(costs: Costs, tokens: int, chunk: int = PREFILL_CHUNK) -> float:
    """Predicted seconds of a prefill of ``tokens`` tokens in forwards of ``chunk`` rows
    (``engine.backends.PREFILL_CHUNK``), each extrapolated linearly from the measured rows; the
    attention's growth with the context is left out, so a long prompt takes somewhat longer."""
    full, rest = divmod(tokens, chunk)
    return full * costs(chunk) + (costs(rest) if rest else 0.0)
