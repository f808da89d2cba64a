"""Measured forward costs kept: one JSON file per cache (``<cache>/costs.json``), one entry
per (machine, backend, model, precision), so each is measured once (``cost_probe``).

An entry's key (``Backend.cost_key``) is the machine (processor model and flags, or GPU name:
``engine.machine.hardware_key``), the backend (torch or llama.cpp, its version and threads),
the model (a fingerprint of its configuration and weights, or of its GGUF file) and its
precision (what its weights are: "int8"/"int4" for a quantised copy, else the dtype it was
loaded in or "gguf": ``Backend.cost_precision``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from specbound.engine.backends import backend_of
from specbound.engine.cost_probe import measure_costs
from specbound.engine.costs import Costs


def cost_key(model, precision: str, device="cpu") -> str:
    """The cost book's key of ``model`` at ``precision`` on ``device``: ``Backend.cost_key`` of
    the backend that holds it."""
    return backend_of(model).cost_key(model, precision, device)


class CostBook:
    """Measured costs, one JSON file, one entry per (machine, model, precision)."""

    def __init__(self, path: Path | str | None):
        self.path = None if path is None else Path(path)
        self._entries = {}
        if self.path is not None and self.path.is_file():
            try:
                self._entries = json.loads(self.path.read_text())
            except (OSError, json.JSONDecodeError):
                self._entries = {}  # a damaged book is measured again

    def costs(self, model, precision: str, device="cpu", measure=measure_costs) -> Costs:
        """The costs of ``model`` (a model a backend holds) at ``precision`` here: from the
        book, else measured now and kept."""
        key = cost_key(model, precision, device)
        if key not in self._entries:
            self._entries[key] = measure(model).to_json()
            self._save()
        return Costs.from_json(self._entries[key])

    def known(self, model, precision: str, device="cpu") -> Costs | None:
        """The costs of ``model`` at ``precision`` here if the book holds them (nothing is
        measured), else None."""
        entry = self._entries.get(cost_key(model, precision, device))
        return None if entry is None else Costs.from_json(entry)

    def _save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(self._entries, indent=1, ensure_ascii=False))
        os.replace(temporary, self.path)
