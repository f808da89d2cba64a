"""A causal language model with its KV cache: a committed sequence plus a speculative tree.

The cache holds two parts:
- the **committed** prefix, positions ``0 .. committed_length − 1``: an ordinary causal
  sequence;
- **speculative** entries after it, each with a parent (the previous committed position
  or an earlier speculative entry). A speculative entry attends to the committed prefix,
  its speculative ancestors and itself — tree attention — and its position id is its
  parent's plus one, so a node at depth k of a tree sees exactly the context it would
  see in a plain sequential forward.

One ``extend_tree`` call scores any number of speculative entries in one forward (a 4D
additive attention mask, position ids = committed length + depth); ``commit`` then keeps
the one accepted path and drops every other speculative entry (rollback).

The output head (vocabulary × hidden: for a small model the largest matrix) is applied
only to the rows that are read (``Scores.logits``): the verification of a tree visits
one path, so the head's cost on the other nodes is saved. This needs the model's logits
to be ``head(base_model(x))``, which is checked once per model; other models get their
full logits from every forward.

An optional **prefill twin** (the same architecture and weights in a wider dtype, e.g.
``copy.deepcopy(model).float()``) runs the first long ``extend`` on an empty cache. On a
CPU without native bfloat16 units (AVX2), a bfloat16 forward costs time linear in its
rows — a long prompt prefill is several times slower than in float32 — while one-token
decoding is fastest in bfloat16. The twin's keys and values are converted to the model's
dtype into the cache, its last hidden states go through the model's own head, and every
later forward is the model's own.

Written against the transformers 5.x cache API: a ``DynamicCache`` whose layers hold
``keys``/``values`` of shape ``[batch, kv_heads, seq, head_dim]``; a 4D float mask passed
as ``attention_mask`` is used as given by both the eager and the SDPA attention.
"""

from __future__ import annotations

import inspect

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class Scores:
    """Next-token logits of the entries of one forward, the output head applied on demand."""

    def __init__(self, states: torch.Tensor, head):
        self._states = states  # [n, hidden] (or [n, logits] with head = identity)
        self._head = head

    def __len__(self) -> int:
        return self._states.shape[0]

    def logits(self, rows=None) -> torch.Tensor:
        """Logits of ``rows`` (an index, list or slice; None = all).  # -> [k, logits] float32"""
        states = self._states if rows is None else self._states[rows]
        if states.ndim == 1:
            states = states[None]
        with torch.no_grad():
            return self._head(states).float()


class CausalLM:
    """Wrap a transformers causal LM (``model(input_ids, ...) -> .logits``) and its cache.

    ``forward_calls`` counts model forwards since the last ``reset`` (a prefill by the
    twin counts as one).

    ``prefill_model``: optional twin of ``model`` (same architecture and weights, usually a
    wider dtype) that runs ``extend`` on an empty cache when it has at least
    ``prefill_min_tokens`` tokens; see the module docstring.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        prefill_model: torch.nn.Module | None = None,
        prefill_min_tokens: int = 16,
    ):
        if (
            isinstance(prefill_min_tokens, bool)
            or not isinstance(prefill_min_tokens, int)
            or prefill_min_tokens < 1
        ):
            raise ValueError(
                f"prefill_min_tokens: expected a positive int, got {prefill_min_tokens!r}"
            )
        self.model = model.eval()
        self._cache_argument = _cache_argument(model)
        self._head = model.get_output_embeddings()
        self._factorized = self._logits_are_head_of_base_model()
        if prefill_model is not None:
            _check_twin(model, prefill_model)
            prefill_model = prefill_model.eval()
        self.prefill_model = prefill_model
        self.prefill_min_tokens = prefill_min_tokens
        self.reset()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def logits_size(self) -> int:
        """Number of logits per position (the model's vocabulary, padding included)."""
        return self.model.get_output_embeddings().weight.shape[0]

    def reset(self) -> None:
        """Forget everything: empty cache, no committed or speculative entries."""
        self.cache = DynamicCache(config=self.model.config)
        self.committed_length = 0
        self.forward_calls = 0
        self._parents: list[int] = []  # absolute parent position of each speculative entry
        self._positions: list[int] = []  # position id of each speculative entry
        self._ancestors: list[list[int]] = []  # speculative ancestors-or-self of each entry

    @property
    def length(self) -> int:
        """Cached entries, committed and speculative."""
        return self.committed_length + len(self._parents)

    def extend(self, token_ids, last_only: bool = False) -> torch.Tensor:
        """Append committed tokens; return their next-token logits.

        Only allowed with no speculative entries (``commit`` first).
        # token_ids [n] -> logits [n, logits_size] float32 ([1, logits_size] if last_only)
        """
        if self._parents:
            raise ValueError("extend: speculative entries are pending; commit a path first")
        tokens = self._as_tokens(token_ids)
        if (
            self.prefill_model is not None
            and self.length == 0
            and tokens.shape[0] >= self.prefill_min_tokens
        ):
            scores = self._prefill_by_twin(tokens, last_only=last_only)
        else:
            scores = self._forward(
                tokens, attention_mask=None, position_ids=None, last_only=last_only
            )
        self.committed_length += tokens.shape[0]
        return scores.logits([-1] if last_only else None)

    def extend_tree(self, token_ids, parents) -> Scores:
        """Append speculative entries and score them all in one forward.

        ``parents[i]`` is the absolute cache position of entry i's parent: the last
        committed position ``committed_length − 1`` (−1 when nothing is committed), an
        existing speculative entry, or an earlier entry of this call (``length + j``, j < i).
        # token_ids [n], parents [n] -> Scores of n entries
        """
        tokens = self._as_tokens(token_ids)
        parents = [int(parent) for parent in parents]
        if len(parents) != tokens.shape[0]:
            raise ValueError(
                f"parents: expected one parent per token ({tokens.shape[0]}), got {len(parents)}"
            )
        start = self.length
        for index, parent in enumerate(parents):
            if not self.committed_length - 1 <= parent < start + index:
                raise ValueError(
                    f"parents: entry {index} names parent position {parent}, outside "
                    f"[{self.committed_length - 1}, {start + index})"
                )
        for parent in parents:
            self._add_speculative(parent)
        first_new = start - self.committed_length
        sees = np.zeros((tokens.shape[0], self.length), dtype=bool)  # [n, length]
        sees[:, : self.committed_length] = True
        for row, ancestors in enumerate(self._ancestors[first_new:]):
            sees[row, [self.committed_length + offset for offset in ancestors]] = True
        blocked = torch.finfo(self.dtype).min
        attention_mask = torch.zeros(sees.shape, dtype=self.dtype).masked_fill(
            ~torch.from_numpy(sees), blocked
        )
        position_ids = torch.tensor([self._positions[first_new:]])
        return self._forward(
            tokens,
            attention_mask=attention_mask[None, None].to(self.device),
            position_ids=position_ids.to(self.device),
            last_only=False,
        )

    def commit(self, path_positions) -> None:
        """Keep the speculative entries ``path_positions`` as committed, drop the others.

        ``path_positions`` must be a chain: the first entry's parent is the last committed
        position, each next entry's parent is the one before it. An empty path rolls the
        cache back to the committed prefix.
        """
        path = [int(position) for position in path_positions]
        expected_parent = self.committed_length - 1
        for position in path:
            offset = position - self.committed_length
            if not 0 <= offset < len(self._parents) or self._parents[offset] != expected_parent:
                raise ValueError(
                    f"path_positions: {path} is not a chain of speculative entries starting "
                    f"after committed position {self.committed_length - 1}"
                )
            expected_parent = position
        keep = list(range(self.committed_length)) + path
        if path != list(range(self.committed_length, self.committed_length + len(path))):
            self._gather(torch.tensor(keep, device=self.device))
        self._truncate(len(keep))
        self.committed_length = len(keep)
        self._parents, self._positions, self._ancestors = [], [], []

    # -- internals -------------------------------------------------------------------
    def _as_tokens(self, token_ids) -> torch.Tensor:
        tokens = torch.as_tensor(token_ids, dtype=torch.long).reshape(-1)
        if tokens.numel() == 0:
            raise ValueError("token_ids: expected at least one token")
        if tokens.min() < 0 or tokens.max() >= self.logits_size:
            raise ValueError(
                f"token_ids: ids must lie in [0, {self.logits_size}); got "
                f"[{int(tokens.min())}, {int(tokens.max())}]"
            )
        return tokens

    def _add_speculative(self, parent: int) -> None:
        offset = parent - self.committed_length  # parent's index among speculative entries
        own = len(self._parents)
        self._ancestors.append((self._ancestors[offset] if offset >= 0 else []) + [own])
        self._positions.append((parent if offset < 0 else self._positions[offset]) + 1)
        self._parents.append(parent)

    def _logits_are_head_of_base_model(self) -> bool:
        tokens = torch.tensor([[0, 1]], device=self.device)
        with torch.no_grad():
            full = self.model(input_ids=tokens, use_cache=False).logits
            split = self._head(self.model.base_model(input_ids=tokens, use_cache=False).last_hidden_state)
        return full.shape == split.shape and bool(torch.equal(full, split))

    def _forward(self, tokens, attention_mask, position_ids, last_only) -> Scores:
        arguments = {
            "input_ids": tokens[None].to(self.device),
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "use_cache": True,
            self._cache_argument: self.cache,
        }
        with torch.no_grad():
            if self._factorized:
                states = self.model.base_model(**arguments).last_hidden_state[0]
            else:
                if last_only:
                    arguments["logits_to_keep"] = 1
                states = self.model(**arguments).logits[0]
        self.forward_calls += 1
        return Scores(states, self._head if self._factorized else torch.nn.Identity())

    def _prefill_by_twin(self, tokens, last_only) -> Scores:
        """Run the twin on ``tokens`` (cache empty) with its own cache, move its keys and
        values into ``self.cache`` in the model's dtype; the logits come from the twin's
        last hidden states cast to the model's dtype through the model's head (or from
        the twin's logits rounded to the model's dtype if the model is not factorized)."""
        twin = self.prefill_model
        twin_device = next(twin.parameters()).device
        twin_cache = DynamicCache(config=twin.config)
        arguments = {
            "input_ids": tokens[None].to(twin_device),
            "use_cache": True,
            _cache_argument(twin): twin_cache,
        }
        with torch.no_grad():
            if self._factorized:
                twin_states = twin.base_model(**arguments).last_hidden_state[0]  # [n, hidden]
            else:
                if last_only:
                    arguments["logits_to_keep"] = 1
                twin_states = twin(**arguments).logits[0]  # [n or 1, logits]
            for layer_index, layer in enumerate(twin_cache.layers):
                if layer.is_initialized:
                    # keys/values [batch, kv_heads, n, head_dim]; the first update fixes the
                    # layer's dtype (a DynamicLayer takes it from the tensors it is given)
                    self.cache.update(
                        layer.keys.to(device=self.device, dtype=self.dtype),
                        layer.values.to(device=self.device, dtype=self.dtype),
                        layer_index,
                    )
        self.forward_calls += 1
        states = twin_states.to(device=self.device, dtype=self.dtype)
        return Scores(states, self._head if self._factorized else torch.nn.Identity())

    def _layers(self) -> list[DynamicLayer]:
        for layer in self.cache.layers:
            if type(layer) is not DynamicLayer:
                raise ValueError(
                    f"model: cache layer {type(layer).__name__} is not a plain DynamicLayer "
                    "(sliding-window or linear attention); tree rollback needs full attention"
                )
        return self.cache.layers

    def _gather(self, keep: torch.Tensor) -> None:
        for layer in self._layers():
            layer.keys = layer.keys.index_select(-2, keep)
            layer.values = layer.values.index_select(-2, keep)

    def _truncate(self, length: int) -> None:
        for layer in self._layers():
            if layer.is_initialized:
                layer.keys = layer.keys[..., :length, :]
                layer.values = layer.values[..., :length, :]


def _cache_argument(model: torch.nn.Module) -> str:
    """The cache keyword's name: transformers renamed ``past_key_values`` to ``cache`` in 5.x."""
    parameters = inspect.signature(model.base_model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def _check_twin(model: torch.nn.Module, twin: torch.nn.Module) -> None:
    """A prefill twin must be the model's architecture: same config class, output head
    shape (vocabulary × hidden) and number of layers."""
    if type(twin.config) is not type(model.config):
        raise ValueError(
            f"prefill_model: config {type(twin.config).__name__} differs from the model's "
            f"{type(model.config).__name__}"
        )
    twin_head = tuple(twin.get_output_embeddings().weight.shape)
    model_head = tuple(model.get_output_embeddings().weight.shape)
    if twin_head != model_head:
        raise ValueError(
            f"prefill_model: output head shape {twin_head} (vocabulary × hidden) differs from "
            f"the model's {model_head}"
        )
    twin_layers = twin.config.get_text_config(decoder=True).num_hidden_layers
    model_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    if twin_layers != model_layers:
        raise ValueError(f"prefill_model: {twin_layers} layers, the model has {model_layers}")
