"""Batched torch paths of the verifiers the engine uses most: single, rrs,
rrs_without_replacement, greedy. They consume the same uniforms as the numpy reference
(``Verifier.verify_with_uniforms``: column i decides draft i, the last column samples the
emitted token by inverse CDF) and agree with it draw for draw in float64. No Python
loops over the batch or the vocabulary; the only loop is over the n drafts.

Verifiers without a native path run the numpy reference on float64 copies, so every
registered verifier can be called from the engine. A float32 (or narrower) row of a large
vocabulary sums to 1 only within its rounding (about 1e-6 for 151,936 tokens, beyond the
numpy path's check), so its float64 copy is renormalised first: that is the law a
sampler draws from that row.

Inputs are trusted to be probability rows (the engine's one processing step makes them):
shapes, token ids and the number of drafts are checked, row sums are not (that would cost
a pass over the vocabulary per call); the numpy path checks everything.
"""

from __future__ import annotations

import numpy as np
import torch

from specbound.probability import ZeroResidualError
from specbound.verifiers import Verdict, Verifier


def sample_from_torch(weights, uniforms, needed):
    """Inverse-CDF sample per row from non-negative weights; zero-weight tokens are never
    chosen. Rows where ``needed`` is False may have zero mass and return garbage.
    # weights [batch, vocab], uniforms [batch], needed [batch] -> [batch]"""
    cumulative = torch.cumsum(weights, dim=-1)
    totals = cumulative[:, -1]
    if bool(torch.any(needed & (totals <= 0))):
        raise ZeroResidualError("residual distribution has zero mass; a correct verifier never samples it")
    index = torch.searchsorted(cumulative, (uniforms * totals)[:, None], right=True)[:, 0]
    vocab = weights.shape[-1]
    last_positive = vocab - 1 - torch.argmax((weights.flip(-1) > 0).to(torch.uint8), dim=-1)
    return torch.minimum(index, last_positive)


def _normalized(mass, rows):
    """Renormalise ``mass`` rows; rows outside ``rows`` are left as they are (no division)."""
    totals = mass.sum(dim=-1, keepdim=True)
    if bool(torch.any(rows & (totals[:, 0] <= 0))):
        raise ZeroResidualError("residual distribution has zero mass; a correct verifier never samples it")
    return mass / torch.where(totals > 0, totals, torch.ones_like(totals))


def _ratio(target_mass, draft_mass):
    return torch.clamp(target_mass / draft_mass, max=1.0)


def _rrs(target, draft, tokens, uniforms, without_replacement):
    """RRS (SPEC §4.3): see ``specbound.verifiers.RecursiveRejection``."""
    emitted = torch.full(tokens.shape[:1], -1, dtype=torch.long, device=tokens.device)
    pending = torch.ones(tokens.shape[:1], dtype=torch.bool, device=tokens.device)
    current_target, current_draft = target, draft
    for i in range(tokens.shape[1]):
        token = tokens[:, i : i + 1]  # [batch, 1]
        accept = _ratio(current_target.gather(1, token)[:, 0], current_draft.gather(1, token)[:, 0])
        taken = pending & (uniforms[:, i] < accept)
        emitted = torch.where(taken, token[:, 0], emitted)
        pending = pending & ~taken
        residual = _normalized((current_target - current_draft).clamp_min(0.0), pending)
        current_target = torch.where(pending[:, None], residual, current_target)
        if without_replacement and i + 1 < tokens.shape[1]:
            shrunk = _normalized(current_draft.scatter(1, token, 0.0), pending)
            current_draft = torch.where(pending[:, None], shrunk, current_draft)
    resampled = sample_from_torch(current_target, uniforms[:, -1], pending)
    return torch.where(pending, resampled, emitted)


def _greedy(target, draft, tokens, uniforms):
    """Greedy verifier [HU]: see ``specbound.verifiers.Greedy``."""
    top, last = tokens[:, :-1], tokens[:, -1:]
    in_top = torch.zeros_like(target, dtype=torch.bool).scatter(1, top, True)
    rest_draft = draft.masked_fill(in_top, 0.0)
    rest_draft = rest_draft / rest_draft.sum(dim=-1, keepdim=True)
    leftover = torch.where(in_top, target, (target - rest_draft).clamp_min(0.0))
    accept = _ratio(target.gather(1, last)[:, 0], rest_draft.gather(1, last)[:, 0])
    rejected = uniforms[:, 0] >= accept
    resampled = sample_from_torch(leftover, uniforms[:, -1], rejected)
    return torch.where(rejected, resampled, last[:, 0])


NATIVE = {
    "single": lambda *args: _rrs(*args, without_replacement=False),
    "rrs": lambda *args: _rrs(*args, without_replacement=False),
    "rrs_without_replacement": lambda *args: _rrs(*args, without_replacement=True),
    "greedy": _greedy,
}


def _check_shapes(verifier, target, draft, tokens, uniforms):
    if target.ndim != 2 or draft.shape != target.shape:
        raise ValueError(
            f"draft_probs: expected the target's shape {tuple(target.shape)} as [batch, vocab], "
            f"got {tuple(draft.shape)}"
        )
    if tokens.ndim != 2 or tokens.shape[0] != target.shape[0]:
        raise ValueError(f"draft_tokens: expected [{target.shape[0]}, num_drafts], got {tuple(tokens.shape)}")
    if uniforms.shape != (tokens.shape[0], tokens.shape[1] + 1):
        raise ValueError(f"uniforms: expected {(tokens.shape[0], tokens.shape[1] + 1)}, got {tuple(uniforms.shape)}")
    if bool(torch.any((tokens < 0) | (tokens >= target.shape[1]))):
        raise ValueError(f"draft_tokens: token ids must lie in [0, {target.shape[1]})")
    verifier.check_num_drafts(tokens.shape[1])


def _float64_law(probs: torch.Tensor) -> np.ndarray:
    """Float64 numpy copy of probability rows; renormalised when they were narrower.
    # [batch, vocab] -> [batch, vocab] float64"""
    rows = probs.detach().to(device="cpu", dtype=torch.float64)
    if probs.dtype != torch.float64:
        rows = rows / rows.sum(dim=-1, keepdim=True)
    return rows.numpy()


def verify_torch_with_uniforms(verifier: Verifier, target_probs, draft_probs, draft_tokens, uniforms) -> Verdict:
    """Torch twin of ``Verifier.verify_with_uniforms``.
    # target_probs, draft_probs [batch, vocab]; draft_tokens [batch, n]; uniforms [batch, n + 1]"""
    _check_shapes(verifier, target_probs, draft_probs, draft_tokens, uniforms)
    native = NATIVE.get(verifier.name)
    if native is None:
        verdict = verifier.verify_with_uniforms(
            _float64_law(target_probs),
            _float64_law(draft_probs),
            draft_tokens.cpu().numpy(),
            uniforms.double().cpu().numpy(),
        )
        device = draft_tokens.device
        return Verdict(
            torch.from_numpy(np.asarray(verdict.tokens)).to(device),
            torch.from_numpy(np.asarray(verdict.accepted)).to(device),
        )
    emitted = native(target_probs, draft_probs, draft_tokens, uniforms.to(target_probs.dtype))
    return Verdict(emitted, torch.any(draft_tokens == emitted[:, None], dim=1))


def verify_torch(verifier: Verifier, target_probs, draft_probs, draft_tokens, generator) -> Verdict:
    """Run ``verifier`` on torch tensors with randomness from ``generator``."""
    uniforms = torch.rand(
        (draft_tokens.shape[0], draft_tokens.shape[1] + 1),
        generator=generator,
        dtype=torch.float64,
        device=target_probs.device,
    )
    return verify_torch_with_uniforms(verifier, target_probs, draft_probs, draft_tokens, uniforms)
