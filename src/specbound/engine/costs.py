"""What a forward costs on this machine, measured once and kept.

Speculative decoding pays when the target scores many rows for little more than one, and
the draft costs little: both are properties of the machine, the backend, the model and its
precision (on an AVX2-only CPU a bf16 torch forward costs time linear in its rows; with
AVX512-BF16, AMX or a GPU, 16 rows cost little more than one). ``measure_costs`` times one engine forward
of k new rows — a tree of k children below a context of ``CONTEXT`` tokens, as the engine
scores them — for k in ``ROWS``, and the minimum over repeats (the least disturbed figure
on a shared machine). ``CostBook`` keeps the measurements in one JSON file per cache, keyed
by the machine (processor model and flags, or GPU name), the backend (torch or llama.cpp,
its version and threads), the model (a fingerprint of its configuration and weights, or of
its GGUF file) and its precision (what its weights are: "int8"/"int4" for a quantised copy,
else the dtype it was loaded in or "gguf": ``Backend.cost_precision``), so each is
measured once; ``Costs`` interpolates between the measured row counts, and
``prefill_seconds`` predicts a long prefill from them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specbound.engine.backends import PREFILL_CHUNK, Entries, backend_of
from specbound.engine.machine import cpu_description

ROWS = (1, 2, 4, 8, 16, 32)
CONTEXT = 200
REPEATS = 3


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
    (``engine.backends.torch``), each extrapolated linearly from the measured rows; the attention's
    growth with the context is left out, so a long prompt takes somewhat longer."""
    full, rest = divmod(tokens, chunk)
    return full * costs(chunk) + (costs(rest) if rest else 0.0)


@functools.cache
def float32_beats_bf16(rows: int = 256, width: int = 1536, repeats: int = 3) -> bool:
    """Whether a long forward runs faster in float32 than in bf16 on this CPU, measured: one
    [rows × width] by [width × 4·width] product in each dtype (a prefill's MLP layer), the
    minimum over ``repeats``; float32 wins when bf16 takes over 1.25× as long. True on an
    AVX2-only CPU (bf16 is emulated there), False with AVX512-BF16 or AMX (native bf16
    units). Measured once per process."""
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn((rows, width), generator=generator)
    weight = torch.randn((4 * width, width), generator=generator)

    def seconds(dtype: torch.dtype) -> float:
        x, w = inputs.to(dtype), weight.to(dtype)
        best = float("inf")
        with torch.no_grad():
            torch.nn.functional.linear(x, w)  # first call: kernel selection
            for _ in range(repeats):
                started = time.perf_counter()
                torch.nn.functional.linear(x, w)
                best = min(best, time.perf_counter() - started)
        return best

    return seconds(torch.bfloat16) > 1.25 * seconds(torch.float32)


def measure_costs(model, rows=ROWS, context: int = CONTEXT, repeats: int = REPEATS) -> Costs:
    """Time one forward of k tree rows below a ``context``-token prefix, for each k, as the
    engine's target step runs it on the model's backend (``language_model``)."""
    lm = language_model(model)
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


def language_model(model):
    """The engine's language model over ``model``, on the backend that holds it."""
    return backend_of(model).language_model(model)


def cost_key(model, precision: str, device="cpu") -> str:
    """The cost book's key of ``model`` at ``precision``: the machine and the backend's
    kernels (llama.cpp's version, kernels and threads, or torch's: ``machine_key``) and the
    model (its file, or ``model_fingerprint``): ``Backend.cost_key``."""
    return backend_of(model).cost_key(model, precision, device)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def hardware_key(device: torch.device | str = "cpu") -> str:
    """The processor (model name and a hash of its flags) or the GPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_description()["model"] + " " + hashlib.sha256(cpu_description()["flags"].encode()).hexdigest()[:12]


def machine_key(device: torch.device | str = "cpu") -> str:
    """What makes timings comparable: the hardware (``hardware_key``), the torch version and
    the number of threads."""
    return f"{hardware_key(device)} | torch {torch.__version__} | {torch.get_num_threads()} threads"


def model_fingerprint(model: torch.nn.Module) -> str:
    """A short hash of the model's configuration, dtype, parameter count and a sample of its
    weights: the same model loaded twice has the same fingerprint."""
    digest = hashlib.sha256()
    digest.update(json.dumps(model.config.to_dict(), sort_keys=True, default=str).encode())
    count = 0
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        count += tensor.numel()
        if tensor.device.type != "meta" and tensor.numel():
            digest.update(tensor.flatten()[:64].float().cpu().numpy().tobytes())
    digest.update(str(count).encode())
    return digest.hexdigest()[:16]


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
        """The costs of ``model`` (a torch module or a llama.cpp model) at ``precision``
        here: from the book, else measured now and kept."""
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
