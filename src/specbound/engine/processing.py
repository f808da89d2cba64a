"""Logits → probabilities: the one place it happens, shared by target and draft (SPEC.md §0).

The verifiers are lossless only if the draft probability they are given is exactly the law
the draft token was drawn from, and if target and draft went through the same processing.
So both models' logits pass through one ``Processing`` value, and the draft tokens are
drawn from the very tensor that is later handed to the verifier.

Order of operations (as in Hugging Face ``generate``): drop vocabulary padding, divide by
the temperature, keep the top-k logits, keep the top-p nucleus, renormalise.
Temperature 0 is the argmax point mass (ties to the lower token id).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from specbound.probability import sample_from_torch, uniforms_torch

# float32: on a 150k vocabulary the per-node softmax and verifier ops cost about half of
# float64's, and a row's sum is still within 1e-6 of 1 (the verifiers' tolerance).
PROBS_DTYPE = torch.float32


@dataclass(frozen=True)
class Sampling:
    """A request's sampling settings — temperature, top-k, top-p — checked here, once:
    the value the command line, the server and the Python API hand down to the engine,
    which makes a ``Processing`` of it with the models' vocabulary (``Processing.of``).

    Temperature 0 is greedy decoding; top-k keeps the k largest logits (ties included),
    top-p the smallest prefix of the tokens by probability whose mass reaches it; None
    keeps every token."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        if isinstance(self.temperature, bool) or not (
                isinstance(self.temperature, numbers.Real) and math.isfinite(self.temperature)):
            raise ValueError(f"temperature: expected a finite number >= 0, got {self.temperature!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature: expected a finite number >= 0, got {self.temperature}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, numbers.Integral)
                                       or self.top_k < 1):
            raise ValueError(f"top_k: expected a positive integer or None, got {self.top_k!r}")
        if self.top_p is not None and (isinstance(self.top_p, bool) or not isinstance(self.top_p, numbers.Real)
                                       or not 0 < self.top_p <= 1):
            raise ValueError(f"top_p: expected a number in (0, 1] or None, got {self.top_p!r}")


@dataclass(frozen=True)
class Processing:
    """A ``Sampling``'s temperature, top-k and top-p, applied identically to target and
    draft logits (the settings checked by ``Sampling``).

    ``vocab_size``: keep the first ``vocab_size`` logits and drop the rest (padding rows
    of an embedding matrix that is larger than the tokenizer); None keeps all.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    vocab_size: int | None = None

    def __post_init__(self):
        Sampling(self.temperature, self.top_k, self.top_p)
        if self.vocab_size is not None and (
            not isinstance(self.vocab_size, int) or self.vocab_size < 1
        ):
            raise ValueError(
                f"vocab_size: expected a positive integer or None, got {self.vocab_size!r}"
            )

    @classmethod
    def of(cls, sampling: Sampling, vocab_size: int | None = None) -> Processing:
        """The processing of ``sampling`` over a vocabulary of ``vocab_size`` tokens."""
        return cls(sampling.temperature, sampling.top_k, sampling.top_p, vocab_size)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Probabilities of the next token.  # [rows, model_vocab] -> [rows, vocab] float32"""
        if logits.ndim != 2:
            raise ValueError(f"logits: expected shape [rows, vocab], got {tuple(logits.shape)}")
        if self.vocab_size is not None:
            if logits.shape[1] < self.vocab_size:
                raise ValueError(
                    f"logits: {logits.shape[1]} columns, fewer than vocab_size {self.vocab_size}"
                )
            logits = logits[:, : self.vocab_size]
        logits = logits.to(PROBS_DTYPE)
        if self.temperature == 0:
            return torch.nn.functional.one_hot(
                logits.argmax(dim=-1), logits.shape[-1]
            ).to(PROBS_DTYPE)
        scaled = logits / self.temperature
        if self.top_k is not None and self.top_k < scaled.shape[-1]:
            kth_largest = torch.topk(scaled, self.top_k, dim=-1).values[:, -1:]
            scaled = scaled.masked_fill(scaled < kth_largest, -math.inf)
        probs = torch.softmax(scaled, dim=-1)
        if self.top_p is not None and self.top_p < 1:
            probs = _nucleus(probs, self.top_p)
        # float32 softmax over 151,936 logits sums to 1 only within ~5e-5 (its own accumulation):
        # renormalised by a float64 sum, a row sums to 1 within ~1e-7, what the verifiers assume
        return probs.div_(probs.sum(dim=-1, keepdim=True, dtype=torch.float64).to(probs.dtype))


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the most probable tokens until their mass reaches ``top_p``, renormalise.

    A token is dropped when the mass of the tokens strictly more probable than it (in the
    stable descending order) already reaches ``top_p``; the most probable token is always
    kept.  # [rows, vocab] -> [rows, vocab]
    """
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    kept = probs.masked_fill(drop, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


def sample_tokens(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row drawn from ``probs`` by inverse CDF (one uniform per row; on a
    150k vocabulary several times faster than ``torch.multinomial``).
    # [rows, vocab] -> [rows] int64"""
    return sample_from_torch(probs, uniforms_torch(probs.shape[0], generator, probs))
