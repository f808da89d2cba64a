"""The decoding engine: speculative decoding of causal LMs (SPEC.md §6).

Data flows one way: model logits → ``Processing`` (shared by target and draft) → a
drafter's tree (``drafters``) → one target call (a backend's language model,
``backends``) → the registry's verifiers (``decode``) → tokens and ``RunStats``. A
``Method`` (``methods``) says which tree and which verifier at each depth; the ``Planner``
(``planner``) chooses one step by step. ``assembly.assemble`` builds a ``ModelPair``'s
(``pair``) decoder and schedule.

The names below load on first use: importing ``specbound.engine.precisions`` or
``specbound.engine.backends`` (what the command line builds its parser from) loads no torch.
"""

from specbound.lazy import lazy_attributes

_HOMES = {
    "assemble": "specbound.engine.assembly",
    "CausalLM": "specbound.engine.backends.torch",
    "Decoder": "specbound.engine.decode",
    "Generation": "specbound.engine.decode",
    "METHODS": "specbound.engine.methods",
    "Method": "specbound.engine.methods",
    "ModelDrafter": "specbound.engine.drafters",
    "ModelPair": "specbound.engine.pair",
    "Processing": "specbound.engine.processing",
    "PromptLookupDrafter": "specbound.engine.drafters",
    "RunStats": "specbound.engine.stats",
    "Sampling": "specbound.engine.processing",
    "build_method": "specbound.engine.methods",
}

__all__ = sorted(_HOMES)
__getattr__ = lazy_attributes(__name__, _HOMES)
