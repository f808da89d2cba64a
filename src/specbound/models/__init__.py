"""Real models, offline: the embedded GGUF pair carried by PyPI wheels (``gguf``), loading and
caching (``loading``), the (target, draft) pair every caller uses (``pair``), and prompts
formatted for instruction models (``chat``). No model hub is ever reached.

Import from the submodules: ``specbound.models.gguf`` is light (no transformers), the
others load transformers.
"""

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}  # the model dtypes the command line offers
