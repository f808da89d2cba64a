"""Single-step verifiers of speculative decoding and the one registry that holds them.

Vocabulary (SPEC.md §0): the draft side proposes n tokens x̄ = (x1..xn) from a joint law
D (the verifier's draft scheme); the verifier outputs one token y with law π(y | x̄). The
step is *accepted* when y ∈ x̄ (a residual sample that equals a draft counts), and the
verifier is *lossless* when Σ_x̄ D(x̄) π(·|x̄) = p. p = target, q = draft throughout.

Every verifier is one class, registered with ``@register_verifier``, holding side by side:
- ``verify(target, draft, draft_tokens, rng)`` and ``verify_with_uniforms(..., uniforms)``,
  the numpy reference, batched over rows (``[batch, vocab]``); uniforms are
  ``[batch, num_drafts + 1]``: column i decides draft i, the last column samples the
  emitted token by inverse CDF;
- ``verify_torch(..., generator)`` / ``verify_torch_with_uniforms``, the engine's path on
  torch tensors: the subclass's native ``_verify_torch`` when it has one — consuming the
  same uniforms, so the two agree draw for draw in float64 — else the numpy reference on
  float64 copies;
- ``output_law(target, draft, draft_tokens)``: the exact law π(·|x̄) ``[batch, vocab]``;
- ``acceptance_rate(target, draft, num_drafts)``: the exact P(y ∈ x̄) ``[batch]`` — closed
  form or exact recursion, never Monte Carlo;
- ``optimum(target, draft, num_drafts)``: the α* it is compared with, its draft scheme's
  (SPEC.md §4.2);
- ``label`` for tables and ``for_num_drafts``, the rule for a node that got fewer drafts.
The command line, the engine, the studies and the report iterate ``VERIFIERS``: a new
verifier is one class and its tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from specbound.bounds.rows import RowPairs
from specbound.drafts import DraftScheme, get_draft_scheme
from specbound.probability import SUM_TOLERANCE, as_draft_tokens, as_target_and_draft, is_tensor

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Verdict:
    tokens: np.ndarray  # [batch] the emitted token (a torch tensor on the torch path)
    accepted: np.ndarray  # [batch] bool, emitted token is one of the drafts


def acceptance_ratio(target_mass, draft_mass):
    """min(1, target/draft) for draft > 0, numpy or torch.  # [batch] -> [batch]"""
    if is_tensor(target_mass):
        return (target_mass / draft_mass).clamp(max=1.0)
    with np.errstate(over="ignore"):  # a ratio beyond float64's range is ∞, and min(1, ∞) = 1
        return np.minimum(1.0, target_mass / draft_mass)


def residual_law(leftover, target):
    """The law of the token emitted after a rejection: the unnormalised residual
    ``leftover`` normalised, or the target row as it is where the leftover has no mass,
    numpy or torch.

    Every verifier here has an empty residual only where, in exact arithmetic, it rejects
    with probability 0 (for single-draft sampling, (p − q)+ = 0 with Σp = Σq forces p = q).
    A rejection can still be drawn there from rows that agree only up to rounding — a ratio
    p/q of 1 − 1e-16, or a dominant token stored as 1.0 beside draft tokens of 1e-17, where
    p − q cancels to 0 — and then the target itself, off by rounding, is emitted: never a
    token it rules out, never a division by zero.  # [batch, vocab] x2 -> [batch, vocab]"""
    if is_tensor(leftover):
        import torch

        totals = leftover.sum(dim=-1, keepdim=True)
        return torch.where(totals > 0, leftover / torch.where(totals > 0, totals, 1.0), target)
    totals = leftover.sum(axis=-1, keepdims=True)
    return np.where(totals > 0, leftover / np.where(totals > 0, totals, 1.0), target)


def contains(draft_tokens, tokens):
    """Whether each row's emitted token is one of its drafts.  # [batch, n], [batch] -> [batch]"""
    if is_tensor(draft_tokens):
        return (draft_tokens == tokens[:, None]).any(dim=1)
    return np.any(draft_tokens == tokens[:, None], axis=1)


@dataclass(frozen=True)
class Verifier:
    """Base class: subclasses set the class attributes and the math methods."""

    name: ClassVar[str]
    label: ClassVar[str]  # for tables and figures
    scheme: ClassVar[str]  # the draft scheme its drafts come from
    lossless: ClassVar[bool] = True
    fixed_num_drafts: ClassVar[int | None] = None
    # its exact acceptance is computable at real vocabulary sizes (the studies' default set)
    scalable: ClassVar[bool] = True
    per_node: ClassVar[bool] = True  # decides one node's drafts; False: a whole drafted tree (verifiers.tree)
    attains_optimum: ClassVar[bool] = False  # its acceptance is its draft scheme's α*, by construction

    @property
    def draft_scheme(self) -> DraftScheme:
        return get_draft_scheme(self.scheme)

    # -- the number of drafts ------------------------------------------------------------
    def check_num_drafts(self, num_drafts, draft_probs=None, support=None) -> None:
        if self.fixed_num_drafts is not None and num_drafts != self.fixed_num_drafts:
            raise ValueError(
                f"num_drafts: verifier {self.name!r} takes exactly {self.fixed_num_drafts} "
                f"draft(s), got {num_drafts}"
            )
        self.draft_scheme.check_num_drafts(num_drafts, draft_probs, support)

    def default_num_drafts(self, num_drafts: int) -> int:
        """The count this verifier is evaluated at when ``num_drafts`` are asked for: its
        fixed count if it has one (single draft: 1, SpecHub: 2)."""
        return self.fixed_num_drafts or num_drafts

    def for_num_drafts(self, num_drafts: int) -> Verifier:
        """The verifier for a node that got ``num_drafts`` drafts. A node gets fewer drafts
        than planned only when its draft law has fewer tokens than a distinct-token scheme
        needs (``DraftScheme.effective_num_drafts``); with one draft, a verifier fixed to
        another count (SpecHub) hands over to single-draft speculative sampling, which is
        every verifier's one-draft case."""
        if num_drafts == 1 and self.fixed_num_drafts not in (None, 1):
            return get_verifier("single")
        return self

    # -- input handling shared by every verifier ---------------------------------------
    def _check(self, target_probs, draft_probs, draft_tokens=None, num_drafts=None):
        target, draft = as_target_and_draft(target_probs, draft_probs)
        tokens = None
        if draft_tokens is not None:
            draft_rows = np.shape(draft_tokens)[0] if np.ndim(draft_tokens) == 2 else 1
            if target.shape[0] == 1 and draft_rows > 1:  # one distribution, many draft tuples
                target = np.repeat(target, draft_rows, axis=0)
                draft = np.repeat(draft, draft_rows, axis=0)
            tokens = as_draft_tokens(draft_tokens, target.shape[0], target.shape[1])
            num_drafts = tokens.shape[1]
        self.check_num_drafts(num_drafts, draft)
        if tokens is not None and self.draft_scheme.needs_distinct_support:
            ordered = np.sort(tokens, axis=1)
            if np.any(ordered[:, 1:] == ordered[:, :-1]):
                raise ValueError(
                    f"draft_tokens: the {self.scheme} scheme draws distinct tokens, but a row "
                    "repeats one"
                )
        if tokens is not None and np.any(np.take_along_axis(draft, tokens, axis=1) <= 0):
            raise ValueError(
                "draft_tokens: a draft token has zero draft probability, so it cannot have "
                "been drawn from draft_probs"
            )
        return target, draft, tokens

    # -- public API: numpy -------------------------------------------------------------
    def verify(self, target_probs, draft_probs, draft_tokens, rng: np.random.Generator) -> Verdict:
        """Run the verifier once per row.  # tokens [batch, n] -> Verdict([batch], [batch])"""
        target, draft, tokens = self._check(target_probs, draft_probs, draft_tokens)
        uniforms = rng.random((tokens.shape[0], tokens.shape[1] + 1))
        return self._verdict(tokens, self._verify(target, draft, tokens, uniforms))

    def verify_with_uniforms(self, target_probs, draft_probs, draft_tokens, uniforms) -> Verdict:
        """``verify`` with its randomness given.  # uniforms [batch, num_drafts + 1]"""
        target, draft, tokens = self._check(target_probs, draft_probs, draft_tokens)
        uniforms = np.asarray(uniforms, dtype=np.float64)
        if uniforms.shape != (tokens.shape[0], tokens.shape[1] + 1):
            raise ValueError(
                f"uniforms: expected shape {(tokens.shape[0], tokens.shape[1] + 1)}, "
                f"got {uniforms.shape}"
            )
        return self._verdict(tokens, self._verify(target, draft, tokens, uniforms))

    def output_law(self, target_probs, draft_probs, draft_tokens) -> np.ndarray:
        """Exact law π(·|x̄) of the emitted token given the drafts.  # -> [batch, vocab]"""
        target, draft, tokens = self._check(target_probs, draft_probs, draft_tokens)
        return self._output_law(target, draft, tokens)

    def acceptance_rate(self, target_probs, draft_probs, num_drafts: int) -> np.ndarray:
        """Exact P(emitted token ∈ drafts) under the verifier's draft scheme.  # -> [batch]"""
        target, draft, _ = self._check(target_probs, draft_probs, num_drafts=num_drafts)
        return self._acceptance_rate(target, draft, num_drafts)

    def acceptance_rate_of(self, rows: RowPairs, num_drafts: int) -> np.ndarray:
        """``acceptance_rate`` of checked rows (``bounds.rows``), not checked again.  # -> [batch]"""
        self.check_num_drafts(num_drafts, support=rows.support)
        return self._acceptance_rate(rows.target, rows.draft, num_drafts)

    def refuses_by_estimate(self, num_drafts: int) -> bool:
        """Whether ``acceptance_rate_of`` can refuse a row at ``num_drafts`` by estimating its
        work before doing it (``refusal_by_estimate``); by default it cannot."""
        return False

    def refusal_by_estimate(self, target_row, draft_row, num_drafts: int) -> str | None:
        """Why ``acceptance_rate_of`` would refuse this checked row by its work estimate, None
        where it would compute it: far cheaper than the computation, so a caller that
        discards every row's value once one is refused (the studies) can ask every row
        first.  # [vocab] x2 -> str or None"""
        return None

    def optimum(self, target_probs, draft_probs, num_drafts: int) -> np.ndarray:
        """α* of the verifier's draft scheme: what any lossless verifier could reach with
        the same drafts (SPEC.md §4.2).  # -> [batch]"""
        return self.draft_scheme.optimum(target_probs, draft_probs, num_drafts).acceptance

    # -- public API: torch -------------------------------------------------------------
    def verify_torch(self, target_probs, draft_probs, draft_tokens, generator: torch.Generator) -> Verdict:
        """Run the verifier on torch tensors with randomness from ``generator`` (float64
        uniforms, one row of n + 1 per row, as ``verify_with_uniforms``)."""
        import torch

        uniforms = torch.rand(
            (draft_tokens.shape[0], draft_tokens.shape[1] + 1),
            generator=generator,
            dtype=torch.float64,
            device=target_probs.device,
        )
        return self.verify_torch_with_uniforms(target_probs, draft_probs, draft_tokens, uniforms)

    def verify_torch_with_uniforms(self, target_probs, draft_probs, draft_tokens, uniforms) -> Verdict:
        """Torch twin of ``verify_with_uniforms``, with the numpy path's cheap checks
        (``_check_torch``). Rows narrower than float32 are computed in float32, uniforms in
        the rows' computing dtype (float32 or float64).
        # target_probs, draft_probs [batch, vocab]; draft_tokens [batch, n]; uniforms [batch, n + 1]"""
        import torch

        _check_torch(self, target_probs, draft_probs, draft_tokens, uniforms)
        if not self.native_torch():
            verdict = self.verify_with_uniforms(
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
        dtype = torch.promote_types(target_probs.dtype, torch.float32)
        emitted = self._verify_torch(
            target_probs.to(dtype), draft_probs.to(dtype), draft_tokens, _uniforms_below_one(uniforms, dtype)
        )
        return Verdict(emitted, contains(draft_tokens, emitted))

    @classmethod
    def native_torch(cls) -> bool:
        """Whether the verifier has its own torch path (else the numpy reference runs)."""
        return cls._verify_torch is not Verifier._verify_torch

    # -- the math, per subclass --------------------------------------------------------
    def _verify(self, target, draft, tokens, uniforms) -> np.ndarray:
        """The emitted token per row.  # -> [batch]"""
        raise NotImplementedError

    def _verify_torch(self, target, draft, tokens, uniforms):
        """Native torch path (optional): the emitted token per row, from the same uniforms
        as ``_verify``.  # -> [batch] long"""
        raise NotImplementedError

    def _output_law(self, target, draft, tokens) -> np.ndarray:
        raise NotImplementedError

    def _acceptance_rate(self, target, draft, num_drafts) -> np.ndarray:
        raise NotImplementedError

    @staticmethod
    def _verdict(tokens, emitted) -> Verdict:
        return Verdict(emitted, contains(tokens, emitted))


def _check_torch(verifier, target, draft, tokens, uniforms):
    """The numpy path's checks that are cheap on torch tensors, each a ValueError naming its
    argument: types, shapes, dtypes and devices; finite probabilities in [0, 1] whose rows
    sum to 1 within ``SUM_TOLERANCE`` (float64) or, in a narrower dtype, within 64 ulps or
    what a softmax may carry whatever order its kernel sums in, if more: its normaliser, a
    sum of V terms accumulated in float32 or wider, is exact only to (V − 1)·u relative
    (Higham's γ; u = eps/2 of the accumulating dtype, not of a bf16 or float16 output), and
    each entry's own rounding adds u, so V·u in all (how wide the CPU's vectors are decides
    where in that range a given machine lands); token ids in the
    vocabulary, of positive draft probability, and distinct where the scheme draws
    distinct tokens; uniforms in [0, 1). Elementwise passes over the rows and O(batch·n)
    gathers, with one device sync for all the values."""
    import torch

    for name, tensor in (("target_probs", target), ("draft_probs", draft), ("draft_tokens", tokens),
                         ("uniforms", uniforms)):
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"{name}: expected a torch tensor, got {type(tensor).__name__}")
        if tensor.device != target.device:
            raise ValueError(f"{name}: on {tensor.device}, target_probs on {target.device}")
    if target.ndim != 2 or 0 in target.shape:
        raise ValueError(f"target_probs: expected shape [batch, vocab], got {tuple(target.shape)}")
    if draft.shape != target.shape:
        raise ValueError(
            f"draft_probs: expected the target's shape {tuple(target.shape)} as [batch, vocab], "
            f"got {tuple(draft.shape)}"
        )
    if tokens.ndim != 2 or tokens.shape[0] != target.shape[0]:
        raise ValueError(f"draft_tokens: expected [{target.shape[0]}, num_drafts], got {tuple(tokens.shape)}")
    if uniforms.shape != (tokens.shape[0], tokens.shape[1] + 1):
        raise ValueError(f"uniforms: expected {(tokens.shape[0], tokens.shape[1] + 1)}, got {tuple(uniforms.shape)}")
    for name, tensor in (("target_probs", target), ("draft_probs", draft), ("uniforms", uniforms)):
        if not tensor.is_floating_point():
            raise ValueError(f"{name}: expected a floating-point dtype, got {tensor.dtype}")
    if draft.dtype != target.dtype:
        raise ValueError(f"draft_probs: dtype {draft.dtype} differs from target_probs' {target.dtype}")
    if tokens.dtype != torch.long:
        raise ValueError(f"draft_tokens: expected int64 (torch.long) token ids, got {tokens.dtype}")
    verifier.check_num_drafts(tokens.shape[1])

    vocab_size = target.shape[1]
    tolerance = SUM_TOLERANCE
    sum_dtype = torch.promote_types(target.dtype, torch.float32)  # the softmax's and this check's accumulator
    if target.dtype != torch.float64:
        tolerance = max(SUM_TOLERANCE, 64 * torch.finfo(target.dtype).eps, vocab_size * torch.finfo(sum_dtype).eps / 2)
    in_vocabulary = (tokens >= 0) & (tokens < vocab_size)
    checks = []  # (argument, what must hold, whether it holds: a 0-d bool tensor)
    for name, probs in (("target_probs", target), ("draft_probs", draft)):
        checks += [
            (name, "probabilities must be finite and lie in [0, 1]", ((probs >= 0) & (probs <= 1)).all()),
            (name, f"rows must sum to 1 within {tolerance:.3g}",
             ((probs.sum(dim=-1, dtype=sum_dtype) - 1).abs() <= tolerance).all()),
        ]
    checks += [
        ("draft_tokens", f"token ids must lie in [0, {vocab_size})", in_vocabulary.all()),
        ("draft_tokens", "a draft token has zero draft probability, so it cannot have been drawn from "
         "draft_probs", (draft.gather(1, torch.where(in_vocabulary, tokens, 0)) > 0).all()),
        ("uniforms", "uniforms must lie in [0, 1)", ((uniforms >= 0) & (uniforms < 1)).all()),
    ]
    if verifier.draft_scheme.needs_distinct_support and tokens.shape[1] > 1:
        ordered = torch.sort(tokens, dim=1).values
        checks.append((
            "draft_tokens", f"the {verifier.scheme} scheme draws distinct tokens, but a row repeats one",
            (ordered[:, 1:] != ordered[:, :-1]).all(),
        ))
    holds = torch.stack([held for *_, held in checks]).tolist()  # the one device sync
    for (name, requirement, _), held in zip(checks, holds):
        if not held:
            raise ValueError(f"{name}: {requirement}")


def _uniforms_below_one(uniforms, dtype):
    """Uniforms in ``dtype``, below 1 there too: a float64 uniform within 2⁻²⁵ of 1 rounds to
    1.0 in float32, where it would reject a draft whose acceptance ratio is 1."""
    import torch

    return uniforms.to(dtype).clamp(max=1.0 - torch.finfo(dtype).eps / 2)


def _float64_law(probs: torch.Tensor) -> np.ndarray:
    """Float64 numpy copy of probability rows; renormalised when they were narrower: a
    float32 row of 151,936 tokens sums to 1 only within about 1e-6, and the renormalised
    copy is the law a sampler draws from that row.  # [batch, vocab] -> [batch, vocab] float64"""
    import torch

    rows = probs.detach().to(device="cpu", dtype=torch.float64)
    if probs.dtype != torch.float64:
        rows = rows / rows.sum(dim=-1, keepdim=True)
    return rows.numpy()


VERIFIERS: dict[str, type[Verifier]] = {}


def register_verifier(verifier_class: type[Verifier]) -> type[Verifier]:
    """Class decorator: add a verifier to the registry under its ``name``."""
    if verifier_class.name in VERIFIERS:
        raise ValueError(f"verifier: {verifier_class.name!r} is registered already")
    if isinstance(verifier_class.scheme, str):  # a parametrised verifier names it per instance
        get_draft_scheme(verifier_class.scheme)
    VERIFIERS[verifier_class.name] = verifier_class
    return verifier_class


def get_verifier(name: str, **parameters) -> Verifier:
    """Look a verifier up by name; ``parameters`` go to its constructor
    (``epsilon`` for decoding_opt/uno, ``resample`` for decoding_uno,
    ``draft_scheme`` for optimal)."""
    try:
        verifier_class = VERIFIERS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"verifier: unknown verifier {name!r}; choose one of {sorted(VERIFIERS)}"
        ) from None
    try:
        return verifier_class(**parameters)
    except TypeError:
        raise ValueError(
            f"verifier: {name!r} does not take parameters {sorted(parameters)}"
        ) from None
