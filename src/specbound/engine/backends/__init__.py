"""Backends: whose kernels run a model's forwards, each behind one language-model protocol.

The decoder, the drafters and the planner see a ``LanguageModel``: a batch of rows, each a
committed prefix plus pending speculative entries (``Entries``: tokens with parents, for
tree attention), scored in one forward (``score`` → ``ForwardScores``), one path per row
kept (``commit``). Two backends implement it:

- ``torch`` (``backends.torch``): a transformers model in a floating dtype on torch (CPU or
  CUDA), with a float32 prefill twin and weight-only int8/int4 copies (``torch_quantize``);
- ``llama.cpp`` (``backends.llamacpp``): a GGUF file as it is, on llama.cpp's CPU kernels,
  with the probe that decides whether its AMX kernels may run (``llamacpp_amx``).

A ``Backend`` object says everything that differs between them — how it loads a model from
the files the models layer finds (``ModelFiles``), what a pair records of it, the language
model over a loaded model, one plain forward over a sequence (``sequence_logits``), its
device and context, its cost-book key, the precisions it runs, whether it can run given
models on a device — so nothing outside this package asks which backend it holds, and a
third backend is a module here, named in ``BACKENDS`` and ``_MODULES``. ``BaseLM`` holds the
checks both language models make of their inputs, once.

This module imports no torch (the command line builds its choices from it); a backend's
module loads when ``get_backend`` first names it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pathlib import Path

    import torch

BACKENDS = ("llama.cpp", "torch")  # in the order "auto" prefers them
CHOICES = ("auto", *BACKENDS)
PREFILL_CHUNK = 512  # tokens per prefill forward: a longer prompt is prefilled in chunks
_MODULES = {"llama.cpp": "specbound.engine.backends.llamacpp", "torch": "specbound.engine.backends.torch"}


@dataclass(frozen=True)
class Entries:
    """New entries of one row for one forward: tokens and their parents (−1: the row's
    last committed token; i ≥ 0: the row's pending entry i, numbered in order of scoring
    since the last commit, this call's entries included)."""

    tokens: list[int]
    parents: list[int]

    @classmethod
    def chain(cls, tokens, after: int = -1) -> Entries:
        """A chain of tokens below ``after`` (−1 or a pending entry)."""
        tokens = [int(token) for token in tokens]
        return cls(tokens, [after] + [after + 1 + i if after >= 0 else i for i in range(len(tokens) - 1)])


class ForwardScores(Protocol):
    """The next-token logits of one forward's entries, computed when read: entry (row, i)
    is the row's i-th new entry of that forward."""

    def prefetch(self, pairs: list[tuple[int, int]]) -> None: ...

    def logits(self, row: int = 0, entries=None) -> torch.Tensor: ...  # -> [k, logits]


class LanguageModel(Protocol):
    """A batched language model with its cache, one row per sequence: what the decoder asks
    of the target and of the drafter's models (``backends.torch`` describes the interface)."""

    lengths: list[int]  # committed entries per row
    forward_calls: int
    model_seconds: float

    @property
    def device(self) -> torch.device: ...

    @property
    def logits_size(self) -> int: ...

    @property
    def max_positions(self) -> int | None: ...

    def reset(self, batch_size: int = 1, cells: int | None = None) -> None: ...

    def prefill(self, row: int, token_ids) -> torch.Tensor: ...

    def prefill_rows(self, prompts: dict[int, list[int]]) -> None: ...

    def add_row(self, cells: int | None = None) -> int: ...

    def score(self, entries: list[Entries], *, outputs: list[range] | None = None) -> ForwardScores: ...

    def commit(self, paths: list[list[int]]) -> None: ...

    def select_rows(self, rows: list[int]) -> None: ...


class BaseLM:
    """The input checks of every backend's language model, in one place. A subclass keeps
    ``batch_size`` and says how many entries of a row are pending and their parents
    (``pending_parents``); each check raises a ValueError naming the argument before
    anything changes."""

    batch_size: int

    @property
    def logits_size(self) -> int:
        raise NotImplementedError

    def pending_parents(self, row: int) -> list[int]:
        """The parents of row ``row``'s pending entries, in order."""
        raise NotImplementedError

    def checked_tokens(self, token_ids) -> torch.Tensor:
        """``token_ids`` as a 1-D int64 tensor of at least one id in [0, logits_size).  # -> [n]"""
        import torch

        tokens = torch.as_tensor(token_ids, dtype=torch.long).reshape(-1)
        if tokens.numel() == 0:
            raise ValueError("token_ids: expected at least one token")
        if tokens.min() < 0 or tokens.max() >= self.logits_size:
            raise ValueError(
                f"token_ids: ids must lie in [0, {self.logits_size}); got [{int(tokens.min())}, {int(tokens.max())}]"
            )
        return tokens

    def check_entries(self, entries: list[Entries]) -> list[int]:
        """One ``Entries`` per row, at least one token in all, every token in the vocabulary
        and every parent an earlier entry of its row; returns the new entries per row."""
        if len(entries) != self.batch_size:
            raise ValueError(f"entries: expected one Entries per row ({self.batch_size}), got {len(entries)}")
        counts = [len(row.tokens) for row in entries]
        if not any(counts):
            raise ValueError("entries: no row adds a token")
        for b, row in enumerate(entries):
            if len(row.parents) != len(row.tokens):
                raise ValueError(f"entries: row {b} has {len(row.tokens)} tokens and {len(row.parents)} parents")
            if row.tokens:
                self.checked_tokens(row.tokens)
            known = len(self.pending_parents(b))
            for index, parent in enumerate(row.parents):
                if not -1 <= parent < known + index:
                    raise ValueError(f"entries: row {b} entry {index} names parent {parent}, outside "
                                     f"[-1, {known + index})")
        return counts

    def check_paths(self, paths: list[list[int]]) -> None:
        """One path per row, each a chain of pending entries starting below the committed prefix."""
        if len(paths) != self.batch_size:
            raise ValueError(f"paths: expected one path per row ({self.batch_size}), got {len(paths)}")
        for b, path in enumerate(paths):
            parents, expected = self.pending_parents(b), -1
            for entry in path:
                if not 0 <= entry < len(parents) or parents[entry] != expected:
                    raise ValueError(f"paths: row {b}'s path {path} is not a chain of pending entries below its "
                                     "committed prefix")
                expected = entry

    def check_nothing_pending(self, what: str, rows=None) -> None:
        """Refuse ``what`` while a row of ``rows`` (None: every row) has pending entries."""
        for row in range(self.batch_size) if rows is None else rows:
            if self.pending_parents(row):
                raise ValueError(f"{what}: commit the pending entries first")


@dataclass(frozen=True)
class Rounding:
    """How far one sequence's next-token laws at temperature 0.7 differ between batch shapes
    on a backend's kernels — the reference's way (the prompt prefilled alone, then one
    forward over the continuation) against one row or four rows a forward — measured on the
    default target (``benchmarks/audit/bench_audit_rounding.py``,
    ``benchmarks/results/audit/rounding.json``) and rounded up with a margin: how far a
    correct speculative engine's rows may lie from an auditor's reference on these kernels.
    The auditor measures this on the audited model itself (``audit.tolerances``); these are
    its tolerances only for a reference it cannot score at other batch shapes.

    ``mean_tv``: the mean total variation per row; ``row_tv``: one row's, the largest;
    ``score_drift``: Σ|E'[f] − E[f]| / Σσ and ``score_variance``: Σ E'[(f − E[f])²] / Σσ² − 1,
    f = log max(p, 0.01) of the reference's row p, E' under the other row, σ² = Var_p(f) (the
    auditor's sharpness test, ``audit.pit``)."""

    mean_tv: float
    row_tv: float
    score_drift: float
    score_variance: float


class ModelFiles(Protocol):
    """What the models layer (``models.loading.ModelFiles``) hands a backend's loader: a model
    source — an embedded model's name, a ``.gguf`` path or a Hugging Face folder — resolved to
    files, offline, with its progress shown or not."""

    def gguf(self, source) -> tuple[Path, str]: ...  # the GGUF file and its SHA-256

    def gguf_tokenizer(self, path: Path, sha256: str): ...  # the tokenizer transformers reads from that file

    def transformers(self, source, dtype: torch.dtype, tokenizer: bool = True) -> tuple: ...  # (model, tokenizer)


class Backend:
    """What differs between backends, asked of the backend object, never by its name.

    ``name``: as the command line and the records write it; ``float32_twins``: whether it
    keeps float32 prefill twins of a bf16 model; ``install``: how to get it where it is
    not installed, and ``missing`` what a user misses without it; ``rounding``: how far its
    kernels' rows differ between batch shapes (``Rounding``)."""

    name: str
    float32_twins: bool = False
    rounding: Rounding
    install: str = ""
    missing: str = ""

    def available(self) -> bool:
        """Whether it can run here (its library imports)."""
        return True

    def holds(self, model) -> bool:
        """Whether ``model`` is a model this backend loaded."""
        raise NotImplementedError

    def refusal(self, not_gguf: list[str], device: str) -> str | None:
        """Why it cannot run models of which ``not_gguf`` are no GGUF files on ``device``
        (one line, for a ValueError naming ``backend``), or None where it can, its library
        aside (``available``)."""
        return None

    def language_model(self, model, twin=None, variants: dict | None = None) -> LanguageModel:
        """The engine's language model over a loaded ``model`` (with its prefill ``twin``
        and its ``variants`` at other precisions where the backend has them)."""
        raise NotImplementedError

    def load(self, source, files: ModelFiles, dtype: torch.dtype, threads: int | None = None,
             tokenizer: bool = True) -> tuple:
        """``source`` loaded this backend's way from ``files``: (model, its tokenizer, or None
        without ``tokenizer``). ``dtype``: the weights' dtype where the backend converts them;
        ``threads``: CPU threads per forward where the backend takes a number."""
        raise NotImplementedError

    def logits_size(self, model) -> int:
        """Logits per row of ``model``'s output: its vocabulary, padding rows included."""
        raise NotImplementedError

    def eos_token_ids(self, model) -> set[int]:
        """The EOS ids ``model``'s own files name, besides its tokenizer's."""
        return set()

    def float32_twin(self, model):
        """An exact float32 copy of ``model`` (where ``float32_twins``)."""
        raise ValueError(f"float32_twins: the {self.name} backend keeps no float32 twins")

    def models_description(self, target, draft) -> dict:
        """What a pair records of its loaded models besides its settings
        (``settings_description``): their files, threads."""
        return {}

    def sequence_logits(self, model, token_ids: list[int], last: int, dtype: torch.dtype | None = None,
                        twin=None) -> torch.Tensor:
        """Next-token logits at the last ``last`` positions of ``token_ids``, by one plain
        forward over the whole sequence (no cache kept, no engine): how a study scores a
        sequence. ``dtype``: where the backend converts weights, the forward runs in it (by
        ``twin``, the model's copy in it, when given) and its logits are rounded to the
        model's own dtype.  # -> [last, logits] float32, on the CPU"""
        raise NotImplementedError

    def device(self, model) -> torch.device:
        raise NotImplementedError

    def max_positions(self, model) -> int | None:
        """The longest sequence ``model`` takes (its context), None where unknown."""
        raise NotImplementedError

    def to(self, model, device: torch.device):
        """``model`` on ``device`` (a ValueError naming ``device`` where it cannot run there)."""
        raise NotImplementedError

    def precisions(self, device: torch.device) -> tuple[str, ...]:
        """The precisions (``engine.precisions``) it runs a model at on ``device``."""
        from specbound.engine.precisions import AS_LOADED

        return (AS_LOADED,)

    def precision_of(self, model) -> str:
        """The precision ``model`` runs at (``engine.precisions``)."""
        from specbound.engine.precisions import AS_LOADED

        return AS_LOADED

    def at_precision(self, model, precision: str, cache_dir):
        """``model`` at ``precision``, one of ``precisions`` (copies kept under ``cache_dir``)."""
        return model

    def cost_precision(self, model) -> str:
        """What the cost book keys ``model``'s costs by (``engine.cost_book``)."""
        raise NotImplementedError

    def cost_key(self, model, precision: str, device) -> str:
        """The cost book's key of ``model`` at ``precision``: the machine, the backend's
        kernels and the model."""
        raise NotImplementedError

    def settings_description(self, dtype: str, float32_twins: bool) -> dict:
        """What a pair it loads records of its settings (``ModelPair.description``), for a
        model ``dtype`` and float32 twins asked for."""
        return {"backend": self.name}

    def weights_description(self, models: dict, files: bool = True) -> str:
        """How a pair ran, for a report, from its recorded description ``models``."""
        return str(models.get("dtype", "dtype not recorded"))


def get_backend(name: str) -> Backend:
    """The backend named ``name`` (one of ``BACKENDS``), its module loaded on first use; a
    ValueError naming ``backend`` for another name."""
    if not isinstance(name, str) or name not in _MODULES:
        raise ValueError(f"backend: expected one of {', '.join(BACKENDS)}, got {name!r}")
    return importlib.import_module(_MODULES[name]).BACKEND


def backend_of(model) -> Backend:
    """The backend that holds the loaded ``model``."""
    for name in BACKENDS:
        backend = get_backend(name)
        if backend.holds(model):
            return backend
    raise ValueError(f"model: no backend holds a {type(model).__name__}")
