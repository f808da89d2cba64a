"""The zoo: speculative steps as engines in the field wrote them, each with its published bug
— or, for two, a rule claimed lossy that is not — as samplers the auditor can audit, with
each case's exact law of a step's first token.

p = target, q = draft (SPEC.md §0). A step starts at a context, drafts up to γ tokens (no
further than the tokens still wanted), verifies them and emits at least one token. Laws come
from ``Laws``: the processed next-token laws of a pair at every context the samplers reach.
The cases (``CASES``, by name; ``lossless`` says which must pass):

- ``speculative``: speculative sampling (SPEC.md §1): accept x with min(1, p(x)/q(x)), after a
  rejection draw from norm((p − q)+), a bonus token from p after γ acceptances. Lossless.
- ``q_mismatch`` (transformers #47932): drafts drawn from q (temperature, top-k), the ratio
  and the residual computed with the softmax of the draft's raw logits.
- ``shared_noise`` (vLLM #54282): the uniform that drew a draft by inverse CDF is the one the
  acceptance test compares with p(x)/q(x).
- ``argmax_as_sampled`` (dflash #74): drafts are the draft's argmax, verified as if drawn from q.
- ``bf16_drafts`` (DeepSpec #31): drafts drawn from the law of the draft's logits rounded to
  bfloat16, the ratio and the residual computed from its float32 logits.
- ``greedy_verification`` (SGLang #31214): at T > 0 a draft is accepted iff it is the target's
  argmax, and the argmax is emitted after a rejection and as the bonus.
- ``ignored_processors`` (SGLang #10617): the audited law applies min_p and logit_bias
  (``Processors``); under speculation the verifier uses the law without them.
- ``static_ensemble`` (transformers PR #45979): verification against w·p + (1 − w)·q,
  w = ``ENSEMBLE_WEIGHT``: lossy by design.
- ``exact_match`` (mlx-swift-lm #459, claimed lossy): the target samples y from p at each
  drafted position and the draft is accepted iff it equals y; y is emitted otherwise. Lossless:
  the emitted token is y either way.
- ``point_mass_drafts`` (EAGLE #221, claimed lossy): the draft's ``POINT_MASS_CANDIDATES``
  most likely tokens, deterministic, verified in turn with q the point mass on each: accept
  c with the residual target's probability of c, else remove c and renormalise. Lossless:
  recursive rejection sampling with point-mass drafts.

``tiny_zoo(folder)`` is the zoo's own pair: tiny float32 models (``models.tiny``, vocabulary
``TINY_VOCAB``, T = ``TINY_TEMPERATURE``, top-k ``TINY_TOP_K``, three prompts), as GGUF files on
llama.cpp where it is installed (else on torch), with min_p and a logit bias
(``TINY_PROCESSORS``) for the processors case: what the zoo's tests and benchmark audit.

``first_token_law(case, laws, context)`` is the law of a step's first token at ``context``
(every sample's first token, and every later step's), by the formula of the step, and
``first_token_tv`` its TV from the audited law p; ``laws`` is anything called as
``laws(context, kind)`` with the kinds of ``Laws``.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from specbound.engine.processing import Processing

GAMMA = 3  # drafts per step
TINY_VOCAB, TINY_TEMPERATURE, TINY_TOP_K = 8, 0.9, 4
ENSEMBLE_WEIGHT = 0.85  # w of the static ensemble
POINT_MASS_CANDIDATES = 2  # deterministic drafts per position of ``point_mass_drafts``


@dataclass(frozen=True)
class Processors:
    """Logits processors beyond temperature, top-k and top-p, applied to the raw logits before
    the audited ``Processing``: ``logit_bias`` added (token -> bias), then tokens whose
    probability at ``temperature`` is below ``min_p`` times the largest removed."""

    temperature: float
    min_p: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """# [rows, vocab] -> [rows, vocab]"""
        logits = logits.clone()
        for token, bias in self.logit_bias:
            logits[:, token] += bias
        if self.min_p > 0:
            probs = torch.softmax(logits.double() / self.temperature, dim=-1)
            logits = logits.masked_fill(probs < self.min_p * probs.amax(dim=-1, keepdim=True), -torch.inf)
        return logits


class ProcessedLM:
    """A language model of the engine's protocol whose logits pass through ``processors``: the
    auditor's reference for a law with processors its ``Processing`` does not hold."""

    def __init__(self, language_model, processors: Callable[[torch.Tensor], torch.Tensor]):
        self.language_model = language_model
        self.processors = processors
        self.model = getattr(language_model, "model", None)

    @property
    def logits_size(self) -> int:
        return self.language_model.logits_size

    @property
    def max_positions(self):
        return self.language_model.max_positions

    def reset(self, batch_size: int = 1, cells: int | None = None) -> None:
        self.language_model.reset(batch_size, cells)

    def prefill(self, row: int, token_ids) -> torch.Tensor:
        return self.processors(self.language_model.prefill(row, token_ids).float())

    def score(self, entries):
        scores, processors = self.language_model.score(entries), self.processors

        class Scores:
            def logits(self, row: int = 0, chosen=None) -> torch.Tensor:
                return processors(scores.logits(row, chosen).float())
        return Scores()

    def commit(self, paths) -> None:
        self.language_model.commit(paths)


class Laws:
    """The laws the samplers use at each context (a tuple of token ids, prompt included), from
    ``logits(contexts) -> [rows, vocab]`` of the target and the draft (raw logits), kept:
    ``target`` (the audited law: ``processors`` then ``processing``), ``target_plain`` (the
    processing alone), ``draft`` (processing), ``draft_raw`` (the softmax of the raw logits) and
    ``draft_bf16`` (processing of the logits rounded to bfloat16). ``prefetch`` scores every
    context up to a depth in one call per prompt."""

    KINDS = ("target", "target_plain", "draft", "draft_raw", "draft_bf16")

    def __init__(self, target_logits, draft_logits, processing: Processing, processors=None):
        self.target_logits, self.draft_logits = target_logits, draft_logits
        self.processing = processing
        self.raw = Processing(1.0, vocab_size=processing.vocab_size)
        self.processors = processors
        self._laws: dict[tuple, dict[str, np.ndarray]] = {}

    def __call__(self, context, kind: str = "target") -> np.ndarray:
        """The law of ``kind`` at ``context``.  # -> [vocab] float64"""
        context = tuple(context)
        if context not in self._laws:
            self._add([context])
        return self._laws[context][kind]

    def prefetch(self, prompt: list[int], depth: int, vocab: int) -> None:
        """Every context of ``prompt`` and up to ``depth`` tokens after it."""
        contexts = [tuple(prompt) + tail for length in range(depth + 1)
                    for tail in itertools.product(range(vocab), repeat=length)]
        self._add([context for context in contexts if context not in self._laws])

    def _add(self, contexts: list[tuple]) -> None:
        target, draft = self.target_logits(contexts).float(), self.draft_logits(contexts).float()
        processed = self.processors(target) if self.processors is not None else target
        laws = {"target": self._normalised(self.processing.probs(processed)),
                "target_plain": self._normalised(self.processing.probs(target)),
                "draft": self._normalised(self.processing.probs(draft)),
                "draft_raw": self._normalised(self.raw.probs(draft)),
                "draft_bf16": self._normalised(self.processing.probs(draft.bfloat16().float()))}
        for index, context in enumerate(contexts):
            self._laws[context] = {kind: rows[index] for kind, rows in laws.items()}

    @staticmethod
    def _normalised(probs: torch.Tensor) -> np.ndarray:
        rows = probs.double().numpy()
        return rows / rows.sum(axis=1, keepdims=True)


def lm_logits(language_model) -> Callable[[list[tuple]], torch.Tensor]:
    """``logits(contexts)`` of a language model of the engine's protocol: each context
    prefilled alone, its last row.  # -> [len(contexts), logits]"""
    def logits(contexts: list[tuple]) -> torch.Tensor:
        rows = []
        for context in contexts:
            language_model.reset(1, cells=len(context) + 1)
            rows.append(language_model.prefill(0, list(context))[-1].float())
        return torch.stack(rows)
    return logits


def draw(probs: np.ndarray, uniform: float) -> int:
    """The token of ``probs`` at ``uniform`` by inverse CDF.  # [vocab] -> int"""
    return min(int(np.searchsorted(np.cumsum(probs), uniform, side="right")), probs.size - 1)


def _accept_probabilities(target_probs: np.ndarray, ratio_probs: np.ndarray) -> np.ndarray:
    """min(1, p(x)/q(x)) for every x, 1 where q(x) = 0 < p(x).  # [vocab] x2 -> [vocab]"""
    positive = ratio_probs > 0
    ratio = np.divide(target_probs, ratio_probs, out=np.zeros_like(target_probs), where=positive)
    return np.where(positive, np.minimum(1.0, ratio), (target_probs > 0).astype(float))


def _accept_probability(target_probs: np.ndarray, ratio_probs: np.ndarray, token: int) -> float:
    return float(_accept_probabilities(target_probs[token: token + 1], ratio_probs[token: token + 1])[0])


def _residual(target_probs: np.ndarray, ratio_probs: np.ndarray) -> np.ndarray:
    """norm((p − q)+), p itself where that is empty."""
    residual = np.maximum(target_probs - ratio_probs, 0.0)
    return residual / residual.sum() if residual.sum() > 0 else target_probs


def _speculative_step(laws: Laws, context: list[int], gamma: int, rng, target: str = "target",
                      drawn: str = "draft", ratio: str = "draft", shared_noise: bool = False,
                      argmax_drafts: bool = False, ensemble: float | None = None) -> list[int]:
    """One step of speculative sampling against the law ``target`` (an ``ensemble`` w·p + (1 − w)·q
    where given): drafts from ``drawn`` (its argmax with ``argmax_drafts``), the ratio and the
    residual from ``ratio``; ``shared_noise``: the draft's uniform decides its acceptance too."""
    def target_law(at):
        law = laws(at, target)
        return law if ensemble is None else ensemble * law + (1 - ensemble) * laws(at, ratio)

    drafts, uniforms = [], []
    for _ in range(gamma):
        law = laws(context + drafts, drawn)
        uniform = rng.random()
        drafts.append(int(np.argmax(law)) if argmax_drafts else draw(law, uniform))
        uniforms.append(uniform)
    emitted = []
    for token, uniform in zip(drafts, uniforms):
        here = context + emitted
        target_probs, ratio_probs = target_law(here), laws(here, ratio)
        if (uniform if shared_noise else rng.random()) < _accept_probability(target_probs, ratio_probs, token):
            emitted.append(token)
            continue
        return emitted + [draw(_residual(target_probs, ratio_probs), rng.random())]
    return emitted + [draw(target_law(context + emitted), rng.random())]


def _match_step(laws: Laws, context: list[int], gamma: int, rng, greedy: bool) -> list[int]:
    """Match verification: the target picks its own token at each drafted position — its
    argmax (``greedy``: SGLang's greedy verification at T > 0, lossy) or a sample from its
    law (exact match, lossless) — and a sampled draft is kept iff it is that token."""
    def target_token(prefix: list[int]) -> int:
        row = laws(context + prefix, "target")
        return int(np.argmax(row)) if greedy else draw(row, rng.random())

    drafts = []
    for _ in range(gamma):
        drafts.append(draw(laws(context + drafts, "draft"), rng.random()))
    emitted = []
    for token in drafts:
        emitted.append(target_token(emitted))
        if token != emitted[-1]:
            return emitted
    return emitted + [target_token(emitted)]


def _point_mass_step(laws: Laws, context: list[int], gamma: int, rng) -> list[int]:
    """Deterministic top drafts per position, each verified with q its point mass."""
    emitted = []
    for _ in range(gamma):
        here = context + emitted
        residual = laws(here, "target").copy()
        candidates = np.argsort(-laws(here, "draft"), kind="stable")[:POINT_MASS_CANDIDATES]
        for candidate in candidates:
            if residual.sum() > 0 and rng.random() < residual[candidate] / residual.sum():
                emitted.append(int(candidate))
                break
            residual[candidate] = 0.0
        else:
            return emitted + [draw(residual / residual.sum(), rng.random())]
    return emitted + [draw(laws(context + emitted, "target"), rng.random())]


STEPS: dict[str, Callable] = {
    "speculative": _speculative_step,
    "q_mismatch": lambda laws, context, gamma, rng: _speculative_step(laws, context, gamma, rng, ratio="draft_raw"),
    "shared_noise": lambda laws, context, gamma, rng: _speculative_step(laws, context, gamma, rng, shared_noise=True),
    "argmax_as_sampled": lambda laws, context, gamma, rng: _speculative_step(laws, context, gamma, rng,
                                                                             argmax_drafts=True),
    "bf16_drafts": lambda laws, context, gamma, rng: _speculative_step(laws, context, gamma, rng, drawn="draft_bf16"),
    "greedy_verification": functools.partial(_match_step, greedy=True),
    "ignored_processors": lambda laws, context, gamma, rng: _speculative_step(laws, context, gamma, rng,
                                                                              target="target_plain"),
    "static_ensemble": lambda laws, context, gamma, rng: _speculative_step(laws, context, gamma, rng,
                                                                           ensemble=ENSEMBLE_WEIGHT),
    "exact_match": functools.partial(_match_step, greedy=False),
    "point_mass_drafts": _point_mass_step,
}
CASES = {  # name -> (published instance, lossless)
    "speculative": ("speculative sampling (SPEC.md §1)", True),
    "q_mismatch": ("transformers #47932", False),
    "shared_noise": ("vLLM #54282", False),
    "argmax_as_sampled": ("dflash #74", False),
    "bf16_drafts": ("DeepSpec #31", False),
    "greedy_verification": ("SGLang #31214", False),
    "ignored_processors": ("SGLang #10617", False),
    "static_ensemble": ("transformers PR #45979", False),
    "exact_match": ("mlx-swift-lm #459", True),
    "point_mass_drafts": ("EAGLE #221", True),
}


def zoo_sampler(case: str, laws: Laws, gamma: int = GAMMA):
    """The auditor's ``sampler(prompt_ids, max_new_tokens, seed)`` of ``case``: steps until
    ``max_new_tokens`` tokens, no step drafting past them."""
    if case not in STEPS:
        raise ValueError(f"case: expected one of {', '.join(STEPS)}, got {case!r}")
    step = STEPS[case]

    def sample(prompt, max_new_tokens, seed):
        rng = np.random.default_rng(seed)
        context = list(prompt)
        while len(context) - len(prompt) < max_new_tokens:
            context += step(laws, context, min(gamma, max_new_tokens - (len(context) - len(prompt)) - 1), rng)
        return context[len(prompt):][:max_new_tokens]
    return sample


def speculative_law(target_probs: np.ndarray, drawn_probs: np.ndarray, ratio_probs: np.ndarray) -> np.ndarray:
    """The law of the first token of a speculative step: drafts drawn from ``drawn_probs``, the
    ratio and the residual computed with ``ratio_probs`` (SPEC.md §1; lossless where the two
    are one law).  # [vocab] x3 -> [vocab]"""
    accepted = drawn_probs * _accept_probabilities(target_probs, ratio_probs)
    return accepted + (1 - accepted.sum()) * _residual(target_probs, ratio_probs)


def first_token_law(case: str, laws: Laws, context) -> np.ndarray:
    """The exact law of a step's first token at ``context`` (module docstring).  # -> [vocab]"""
    target, draft = laws(context, "target"), laws(context, "draft")
    if case in ("speculative", "exact_match"):
        return speculative_law(target, draft, draft)
    if case == "q_mismatch":
        return speculative_law(target, draft, laws(context, "draft_raw"))
    if case == "bf16_drafts":
        return speculative_law(target, laws(context, "draft_bf16"), draft)
    if case == "ignored_processors":
        return speculative_law(laws(context, "target_plain"), draft, draft)
    if case == "static_ensemble":
        mixed = ENSEMBLE_WEIGHT * target + (1 - ENSEMBLE_WEIGHT) * draft
        return speculative_law(mixed, draft, draft)
    if case == "argmax_as_sampled":
        point = np.zeros_like(draft)
        point[int(np.argmax(draft))] = 1.0
        return speculative_law(target, point, draft)
    if case == "greedy_verification":
        point = np.zeros_like(target)
        point[int(np.argmax(target))] = 1.0
        return point
    if case == "shared_noise":
        cumulative = np.cumsum(draft)
        accepted = np.maximum(0.0, np.minimum(cumulative, _accept_probabilities(target, draft)) - (cumulative - draft))
        return accepted + (1 - accepted.sum()) * _residual(target, draft)
    if case == "point_mass_drafts":
        law, residual = np.zeros_like(target), target.copy()
        for candidate in np.argsort(-draft, kind="stable")[:POINT_MASS_CANDIDATES]:
            if residual.sum() > 0:
                law[candidate] += (1 - law.sum()) * residual[candidate] / residual.sum()
            residual[candidate] = 0.0
        return law + (1 - law.sum()) * residual / residual.sum() if residual.sum() > 0 else law
    raise ValueError(f"case: expected one of {', '.join(STEPS)}, got {case!r}")


def first_token_tv(case: str, laws: Laws, context) -> float:
    """TV between ``first_token_law`` and the audited law at ``context``."""
    return float(0.5 * np.abs(first_token_law(case, laws, context) - laws(context, "target")).sum())


TINY_PROCESSORS = Processors(TINY_TEMPERATURE, min_p=0.1, logit_bias=((3, 0.5),))


@dataclass
class TinyZoo:
    """The zoo's tiny pair (module docstring): its prompts, its laws without and with
    ``TINY_PROCESSORS``, and the auditor's reference for each."""

    prompts: list[list[int]]
    laws: Laws
    processed: Laws
    reference: object
    processed_reference: object
    backend: str

    def of(self, case: str) -> tuple[Laws, object]:
        """(laws, reference) the case is audited with: the processed ones for ``ignored_processors``."""
        return (self.processed, self.processed_reference) if case == "ignored_processors" else (self.laws,
                                                                                                 self.reference)


def tiny_zoo(folder, tokens: int = 4) -> TinyZoo:
    """The tiny pair written under ``folder``, its laws computed for every context up to
    ``tokens`` − 1 tokens after each prompt (module docstring)."""
    from pathlib import Path

    from specbound.audit.reference import Reference
    from specbound.engine.backends.torch import CausalLM
    from specbound.models.tiny import noisy_copy, tiny_model, write_gguf

    target = tiny_model(0, vocab_size=TINY_VOCAB)
    draft = noisy_copy(target, seed=1, noise=0.7)
    try:
        from specbound.engine.backends.llamacpp import LlamaCppLM, LlamaCppModel, llama_cpp_available
        on_llama_cpp = llama_cpp_available()
    except ImportError:
        on_llama_cpp = False
    if on_llama_cpp:
        files = {name: write_gguf(model, Path(folder) / f"{name}.gguf") for name, model in (("target", target),
                                                                                            ("draft", draft))}

        def language_model(name):
            return LlamaCppLM(LlamaCppModel(files[name], threads=1))
    else:
        def language_model(name):
            return CausalLM(target if name == "target" else draft)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, TINY_VOCAB, size=3).tolist() for _ in range(3)]
    processing = Processing(TINY_TEMPERATURE, TINY_TOP_K)
    laws = Laws(lm_logits(language_model("target")), lm_logits(language_model("draft")), processing)
    processed = Laws(laws.target_logits, laws.draft_logits, processing, TINY_PROCESSORS)
    for prompt in prompts:
        laws.prefetch(prompt, tokens - 1, TINY_VOCAB)
        processed.prefetch(prompt, tokens - 1, TINY_VOCAB)
    return TinyZoo(prompts, laws, processed, Reference(language_model("target")),
                   Reference(ProcessedLM(language_model("target"), TINY_PROCESSORS)),
                   "llama.cpp" if on_llama_cpp else "torch")
