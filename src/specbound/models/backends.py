"""Which backend (``engine.backends``) runs given models on a device: ``--backend``'s choice.

- ``llama.cpp``: a GGUF file runs as it is on ggml's kernels, the weights at their own
  quantisation (Q4_K_M for the embedded pair), no conversion;
- ``torch``: the model in a floating dtype on torch (a GGUF file is dequantised once and
  cached, ``models.loading``); the one for Hugging Face folders, CUDA, float32 twins and the
  int8/int4 copies;
- ``auto``: the first of ``engine.backends.BACKENDS`` that can run them at the precision
  asked for — llama.cpp where every model is a GGUF file (embedded or a path), the device is
  the CPU, llama-cpp-python is installed and the precision is the file's own — torch otherwise.
"""

from __future__ import annotations

from pathlib import Path

from specbound.engine.backends import BACKENDS, CHOICES, Backend, get_backend
from specbound.engine.precisions import AS_LOADED
from specbound.models.gguf import EMBEDDED_GGUFS


def is_gguf(source) -> bool:
    """An embedded model's name or a path to a ``.gguf`` file."""
    return (isinstance(source, str) and source in EMBEDDED_GGUFS) or Path(str(source)).suffix == ".gguf"


def resolve_backend(backend: str, sources, device: str = "cpu", precision: str = AS_LOADED) -> Backend:
    """The backend that runs models ``sources`` (None entries skipped) on ``device``: the
    one named (checked to apply, its precisions aside), or the choice of ``auto`` (module
    docstring): the first that runs ``precision`` (an ``engine.precisions`` name) there, else
    the first that runs them at all. ValueError naming ``backend`` where it cannot."""
    if not isinstance(backend, str) or backend not in CHOICES:
        raise ValueError(f"backend: expected one of {', '.join(CHOICES)}, got {backend!r}")
    not_gguf = [str(source) for source in sources if source is not None and not is_gguf(source)]
    if backend != "auto":
        chosen = get_backend(backend)
        reason = chosen.refusal(not_gguf, str(device))
        if reason is None and not chosen.available():
            reason = f"{chosen.name} is not installed: {chosen.install}"
        if reason is not None:
            raise ValueError(f"backend: {reason}")
        return chosen
    runnable = (candidate for candidate in map(get_backend, BACKENDS)
                if candidate.available() and candidate.refusal(not_gguf, str(device)) is None)
    first = next(runnable)
    if precision in first.precisions(device):
        return first
    return next((candidate for candidate in runnable if precision in candidate.precisions(device)), first)


def passed_over(chosen: Backend, sources, device: str = "cpu") -> Backend | None:
    """A backend ``auto`` prefers to ``chosen`` that would run ``sources`` on ``device`` had
    it been installed (None where there is none)."""
    not_gguf = [str(source) for source in sources if source is not None and not is_gguf(source)]
    for candidate in map(get_backend, BACKENDS):
        if candidate is chosen:
            return None
        if not candidate.available() and candidate.refusal(not_gguf, str(device)) is None:
            return candidate
    return None
