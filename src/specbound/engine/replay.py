"""Replay: the accepted lengths of decoding with drafts fixed by the context (prompt lookup,
suffix drafts), computed from a sample of the target's text with no target forward.

At a node whose drafts are a fixed set S (a function of the context, never of a draft
model's draws), a lossless verifier that accepts the most — p(S), the most any rule can,
``engine.suffix`` — emits the target's token y ~ p(·|node) and descends into y's child
exactly when y ∈ S; prompt lookup's point mass is the case |S| = 1. The emitted text is
therefore a sample of the target's law, and each step accepts the deepest drafted path
that text begins with. Replaying a target sample thus draws the accepted lengths with
exactly the engine's law: pointwise, on the engine's own output, they are the engine's
(tested for every verifier of fixed drafts). Several drafters on the same samples compare
paired, without the noise of decoding different texts and without a forward of the target
per drafted tree.
"""

from __future__ import annotations

import torch

from specbound.checks import positive_int


def replay(drafter, method, prompt, text, max_new_tokens: int,
           generator: torch.Generator | None = None) -> list[int]:
    """The drafts accepted at each step when ``drafter`` (one whose drafts are fixed by the
    context: no draft model) and ``method`` decode ``text`` after ``prompt`` (module
    docstring); the drafter then sees the sequence leave, as the decoder's does (a suffix
    drafter's history takes ``text``). Every step's tree is cut at the depth the decoder
    cuts it: ``max_new_tokens`` − emitted − 1. Tokens per target call (prefill excluded):
    ``len(text) / len(steps)``."""
    if drafter.language_models:
        raise ValueError("drafter: its drafts are a draft model's draws, not fixed by the context; "
                         "replay holds for prompt lookup and suffix drafts")
    max_new_tokens = positive_int("max_new_tokens", max_new_tokens)
    if len(text) > max_new_tokens:
        raise ValueError(f"text: {len(text)} tokens, more than max_new_tokens = {max_new_tokens}")
    if not prompt:
        raise ValueError("prompt: empty; a drafter drafts below the context's last token")
    generator = generator if generator is not None else torch.Generator().manual_seed(0)
    context = [int(token) for token in prompt]  # one list, grown in place: drafters know a row by its context
    text = [int(token) for token in text]
    drafter.reset([list(context)])
    accepted, emitted = [], 0
    while emitted < len(text):
        depth = min(method.depth, max_new_tokens - emitted - 1)
        tree = drafter.draft([context], method, [depth], [generator])[0] if depth > 0 else None
        path = []
        for token in text[emitted : emitted + depth]:
            child = tree.children[path[-1] if path else 0].get(token)
            if child is None:
                break
            path.append(child)
        if tree is not None:
            drafter.commit([tree], [path])
        accepted.append(len(path))
        context.extend(text[emitted : emitted + len(path) + 1])
        emitted += len(path) + 1
    drafter.select_rows([])
    return accepted
