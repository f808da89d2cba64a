"""One name per precision a model runs at (``PRECISIONS``), used by the command line, the API,
the planner and the language models' variants alike.

- ``AS_LOADED``: the model itself, at the dtype it was loaded in (``--dtype``: bfloat16 or
  float32) or, on llama.cpp, at its GGUF file's own types;
- "int8", "int4": its weight-only quantised copies (``engine.backends.torch_quantize``, CPU only).

"bf16", the old name of ``AS_LOADED``, is still accepted (``precision_name``). The cost book
keys a model by what its weights are instead (``Backend.cost_precision``), so that a
float32 and a bfloat16 load, both ``AS_LOADED``, are measured apart.
"""

from __future__ import annotations

AS_LOADED = "as-loaded"
PRECISIONS = (AS_LOADED, "int8", "int4")
OLD_NAMES = {"bf16": AS_LOADED}  # "bf16" meant "as loaded" even for a float32 model


def precision_name(name: str, argument: str = "precision") -> str:
    """The name of precision ``name`` in ``PRECISIONS`` (an old name accepted), or a
    ValueError (a TypeError for a value that is no str) naming ``argument``."""
    if not isinstance(name, str):
        raise TypeError(f"{argument}: expected one of {', '.join(PRECISIONS)}, got {type(name).__name__}")
    name = OLD_NAMES.get(name, name)
    if name not in PRECISIONS:
        raise ValueError(f"{argument}: expected one of {', '.join(PRECISIONS)}, got {name!r}")
    return name
