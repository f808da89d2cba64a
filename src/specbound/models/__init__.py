"""Real models, offline: the embedded GGUF pair carried by PyPI wheels (``gguf``), loading and
caching (``loading``), the (target, draft) pair every caller uses (``pair``), and prompts
formatted for instruction models (``chat``). No model hub is ever reached.

Import from the submodules: this package, ``gguf``, ``backends`` and ``precisions`` are light
(no torch, no transformers; the command line builds its parser from them), the others load
torch and transformers.
"""

DTYPES = ("bfloat16", "float32")  # the model dtypes the command line offers, by their names in torch
