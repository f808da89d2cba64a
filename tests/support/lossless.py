"""The tiny pair's losslessness cases and sampling, shared by the engine's χ² tests on each
backend (``tests/engine/test_engine_lossless.py`` on torch, ``test_llamacpp_backend.py`` on
llama.cpp) and the drafters' (``test_cross_tokenizer.py``, ``test_suffix_drafter.py``): the
prompts, the sample count, the methods every backend must decode with the target's exact
sequence law, and that law on llama.cpp (``llamacpp_law``, its rows computed as decoding
computes them). What the test detects (its power) is stated in ``test_engine_lossless``."""

import numpy as np
import torch

from support.models import EOS
from specbound.engine import CausalLM, Decoder, ModelDrafter, Processing
from specbound.engine.backends import Entries

PROMPT = [1]
LOOKUP_PROMPT = [1, 2, 1]  # prompt lookup finds the earlier 1 and proposes 2, 1
NEW_TOKENS = 3
SAMPLES = 400


def sample_sequences(decoder, method, prompt=PROMPT, new_tokens=NEW_TOKENS, seed=0, batched=True):
    """SAMPLES sequences, each from its own generator. ``batched``: decoded as one batch, in
    which each gets the tokens ``generate`` gives it alone (``Decoder.generate_batch``; the tiny
    float32 torch models are batch-invariant), so their law is solo decoding's, rows leaving
    the batch at EOS as they do in serving — a quarter of the time of SAMPLES solo runs.
    Otherwise one ``generate`` after another (a backend whose forward is not batch-invariant)."""
    generators = [torch.Generator().manual_seed(seed * SAMPLES + index) for index in range(SAMPLES)]
    if batched:
        generations = decoder.generate_batch([prompt] * SAMPLES, method, new_tokens, generators)
    else:
        generations = [decoder.generate(prompt, method, new_tokens, generator) for generator in generators]
    return [tuple(generation.tokens) for generation in generations]


def model_decoder(target_model, draft_model, processing):
    drafter = ModelDrafter(CausalLM(draft_model), processing)
    return Decoder(CausalLM(target_model), drafter, processing, eos_token_ids=[EOS])


LOSSLESS_CASES = {
    "autoregressive": ("autoregressive", {}, Processing()),
    "chain": ("chain", {"gamma": 2}, Processing()),
    "tree-rrs_without_replacement": (
        "tree", {"num_drafts": 2, "depth": 2, "verifier": "rrs_without_replacement"}, Processing()),
    # with replacement: equal drafts share a subtree; K-SEQ on its torch path (the engine's)
    "tree-kseq": ("tree", {"num_drafts": 2, "depth": 2, "verifier": "kseq"}, Processing()),
    # the optimal verifier of i.i.d. drafts (SPEC.md §4.5), its numpy path under the torch API
    "tree-global_resolution": ("tree", {"num_drafts": 2, "depth": 2, "verifier": "global_resolution"}, Processing()),
    # top-p leaves some nodes with a one-token draft law: SpecHub hands over to one draft
    "tree-spechub-top_p": (
        "tree", {"num_drafts": 2, "depth": 2, "verifier": "spechub"},
        Processing(temperature=0.8, top_p=0.8)),
    "batch": ("batch", {"num_drafts": 3, "gamma": 2}, Processing()),
    # a budgeted tree: children decided per node from the draft probabilities, then drawn
    "sparse-rrs_without_replacement": (
        "sparse", {"budget": 5, "depth": 2, "width": 3, "max_children": 3}, Processing()),
    "sparse-greedy-top_k": (
        "sparse", {"budget": 4, "depth": 2, "width": 2, "max_children": 2, "verifier": "greedy"},
        Processing(temperature=0.9, top_k=3)),
}
SLOW_CASES = {
    "decoding_opt-epsilon0": ("decoding_opt", {"gamma": 2, "epsilon": 0.0}, Processing()),
    "tree-rrs-3": ("tree", {"num_drafts": 3, "depth": 2, "verifier": "rrs"}, Processing()),
    "tree-greedy-3": ("tree", {"num_drafts": 3, "depth": 2, "verifier": "greedy"}, Processing()),
    "tree-optimal-2": ("tree", {"num_drafts": 2, "depth": 2, "verifier": "optimal"}, Processing()),
    "tree-rrs_without_replacement-top_k": (
        "tree", {"num_drafts": 3, "depth": 2, "verifier": "rrs_without_replacement"},
        Processing(top_k=2)),
}


TREE_VERIFIER_CASES = {
    "chain-block": ("chain", {"gamma": 2, "verifier": "block"}, Processing()),
    "tree-traversal": ("tree", {"num_drafts": 2, "depth": 2, "verifier": "traversal"}, Processing()),
    "sparse-traversal-top_p": ("sparse", {"budget": 4, "depth": 2, "width": 3, "verifier": "traversal"},
                               Processing(temperature=0.9, top_p=0.9)),
    # i.i.d. drafts: Global Resolution's plan at each node (SPEC.md §7.5); top-p leaves some
    # nodes one draft token, where the plan is speculative sampling on the scaled target
    "tree-univer-top_p": ("tree", {"num_drafts": 2, "depth": 2, "verifier": "univer"},
                          Processing(temperature=0.9, top_p=0.9)),
}


# -- the law on llama.cpp: its rows as decoding computes them ----------------------------------
def alone(lm, tokens):
    """Next-token logits after ``tokens``, scored as decoding scores them: all but the last
    prefilled, the last as one pending entry.  # -> [vocab]"""
    lm.reset(1)
    if len(tokens) > 1:
        lm.prefill(0, tokens[:-1])
    logits = lm.score([Entries.chain(tokens[-1:])]).logits(0)[0]
    lm.commit([[]])
    return logits


def llamacpp_law(lm, prompt, processing, num_tokens, eos=EOS) -> dict[tuple, float]:
    """The law of the next ``num_tokens`` tokens with llama.cpp's own forwards, each prefix's
    row computed as decoding computes it (``alone``), stopping at EOS."""
    law, finished = {(): 1.0}, {}
    for _ in range(num_tokens):
        grown = {}
        for prefix, mass in law.items():
            row = processing.probs(alone(lm, list(prompt) + list(prefix))[None]).double().numpy()[0]
            row /= row.sum()
            for token in np.flatnonzero(row > 0):
                (finished if token == eos else grown)[prefix + (int(token),)] = mass * row[token]
        law = grown
    return {**finished, **law}
