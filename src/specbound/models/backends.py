"""Which kernels run a model pair's forwards: llama.cpp or torch.

- ``llama.cpp``: a GGUF file runs as it is on ggml's kernels (``engine.llamacpp``), the
  weights at their own quantisation (Q4_K_M for the embedded pair), no conversion;
- ``torch``: the model in a floating dtype on torch (a GGUF file is dequantised once and
  cached, ``models.loading``); the one for Hugging Face folders, CUDA, float32 twins and the
  int8/int4 copies of ``models.quantize``;
- ``auto``: llama.cpp where it applies — every model a GGUF file (embedded or a path), the
  CPU as the device and llama-cpp-python importable — torch otherwise.
"""

from __future__ import annotations

from pathlib import Path

from specbound.models.gguf import EMBEDDED_GGUFS

BACKENDS = ("auto", "llama.cpp", "torch")
INSTALL_LLAMA_CPP = "pip install 'specbound[llamacpp]'  (builds llama.cpp from source: needs a C compiler and cmake)"


def is_gguf(source) -> bool:
    """An embedded model's name or a path to a ``.gguf`` file."""
    return (isinstance(source, str) and source in EMBEDDED_GGUFS) or Path(str(source)).suffix == ".gguf"


def resolve_backend(backend: str, sources, device: str = "cpu") -> str:
    """The backend that runs models ``sources`` (None entries skipped) on ``device``:
    ``backend`` itself when it is "llama.cpp" or "torch" (checked to apply), else the
    choice of ``auto`` (module docstring). ValueError naming ``backend`` where it cannot."""
    from specbound.engine.llamacpp import llama_cpp_available

    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    sources = [source for source in sources if source is not None]
    all_gguf = all(is_gguf(source) for source in sources)
    if backend == "torch":
        return "torch"
    if backend == "llama.cpp":
        if not all_gguf:
            others = [str(source) for source in sources if not is_gguf(source)]
            raise ValueError(f"backend: llama.cpp runs GGUF files; {', '.join(others)} is not one (use --backend torch)")
        if str(device) != "cpu":
            raise ValueError(f"backend: this llama.cpp build runs on the CPU, not {device} (use --backend torch)")
        if not llama_cpp_available():
            raise ValueError(f"backend: llama.cpp needs llama-cpp-python, which is not installed: {INSTALL_LLAMA_CPP}")
        return "llama.cpp"
    return "llama.cpp" if all_gguf and str(device) == "cpu" and llama_cpp_available() else "torch"
