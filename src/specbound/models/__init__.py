"""Real models, offline: the embedded GGUF pair carried by PyPI wheels (``gguf``), loading and
caching (``loading``), the (target, draft) pair loaded on a backend (``pair``: the pair itself
is ``engine.pair.ModelPair``), the choice of backend for given model files (``backends``), and
prompts formatted for instruction models (``chat``). No model hub is ever reached.

Import from the submodules: this package, ``gguf`` and ``backends`` are light (no torch, no
transformers; the command line builds its parser from them), the others load torch and
transformers.
"""

DTYPES = ("bfloat16", "float32")  # the model dtypes the command line offers, by their names in torch
