"""The decoding engine: speculative decoding of transformers causal LMs (SPEC.md §6).

Data flows one way: model logits → ``Processing`` (shared by target and draft) → a
drafter's tree (``drafters``) → one target call (``lm``) → the registry's verifiers
(``decode``) → tokens and ``RunStats``. A ``Method`` (``methods``) says which tree and which
verifier at each depth.
"""

from specbound.engine.decode import Decoder, Generation
from specbound.engine.drafters import ModelDrafter, PromptLookupDrafter
from specbound.engine.lm import CausalLM
from specbound.engine.methods import METHODS, Method, build_method
from specbound.engine.processing import Processing
from specbound.engine.stats import RunStats

__all__ = [
    "CausalLM",
    "Decoder",
    "Generation",
    "METHODS",
    "Method",
    "ModelDrafter",
    "Processing",
    "PromptLookupDrafter",
    "RunStats",
    "build_method",
]
