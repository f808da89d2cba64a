"""Torch samplers of the draft schemes (SPEC §4.1), batched, for the engine.

Same laws and the same tie-breaking (towards the lower token id) as ``specbound.drafts``.
# draft_probs [batch, vocab] -> draft tokens [batch, num_drafts] (long)
"""

from __future__ import annotations

import torch


def top_tokens_torch(draft_probs, count: int):
    """The ``count`` most probable tokens per row, most probable first, ties to the lower
    id, in O(V): top-k finds the count-th largest value, ties at it are filled in id
    order.  # [batch, vocab] -> [batch, count]"""
    if count == 0:
        return torch.zeros((draft_probs.shape[0], 0), dtype=torch.long, device=draft_probs.device)
    kth = torch.topk(draft_probs, count, dim=-1).values[:, -1:]
    above, tied = draft_probs > kth, draft_probs == kth
    needed = count - above.sum(dim=-1, keepdim=True)
    chosen = above | (tied & (torch.cumsum(tied, dim=-1) <= needed))
    tokens = torch.nonzero(chosen)[:, 1].view(-1, count)  # id order within each row
    order = torch.sort(draft_probs.gather(1, tokens), dim=-1, descending=True, stable=True).indices
    return tokens.gather(1, order)


def _with_replacement(draft_probs, num_drafts, generator):
    return torch.multinomial(draft_probs, num_drafts, replacement=True, generator=generator)


def _without_replacement(draft_probs, num_drafts, generator):
    # Exponential race: E_x / q(x), E_x ~ Exp(1); arrival order = sampling without replacement.
    arrival = torch.empty_like(draft_probs).exponential_(generator=generator) / draft_probs
    return torch.topk(arrival, num_drafts, dim=-1, largest=False, sorted=True).indices


def _greedy(draft_probs, num_drafts, generator):
    top = top_tokens_torch(draft_probs, num_drafts - 1)
    last = torch.multinomial(draft_probs.scatter(1, top, 0.0), 1, generator=generator)
    return torch.cat([top, last], dim=1)


def _spechub(draft_probs, num_drafts, generator):
    hub = top_tokens_torch(draft_probs, 1)
    first = torch.multinomial(draft_probs, 1, generator=generator)
    other = torch.multinomial(draft_probs.scatter(1, hub, 0.0), 1, generator=generator)
    second = torch.where(first == hub, other, hub)
    return torch.cat([first, second], dim=1)


SAMPLERS = {
    "with_replacement": _with_replacement,
    "without_replacement": _without_replacement,
    "greedy": _greedy,
    "spechub": _spechub,
}
