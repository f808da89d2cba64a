"""The engine's KV cache: one preallocated buffer per layer for a batch of sequences.

transformers' ``DynamicCache`` appends by concatenation, which copies the whole cache at
every forward; speculative decoding also needs to keep an arbitrary path of the entries
just scored and drop the rest, per sequence. ``SpeculativeCache`` holds, per layer, key and
value buffers ``[batch, kv_heads, capacity, head_dim]`` of which the first ``length``
columns are in use (capacity doubles when full, so appends are amortised O(1)); the model
sees views of the used columns through the ordinary ``Cache.update`` interface.

Each row (sequence) b has its own committed length L_b ≤ length: columns at or past L_b
hold entries of this step or stale entries, which the caller's attention mask hides. The
bookkeeping of which columns a row may attend to is the caller's (``engine.backends.torch``); this
module only stores, appends, keeps paths and drops rows.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer


class BufferLayer(DynamicLayer):
    """One layer's keys and values in a growing buffer (module docstring)."""

    def __init__(self):
        super().__init__()
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None
        self.length = 0

    # transformers reads ``keys``/``values``; they are views of the used columns.
    @property
    def keys(self):
        return None if self._key_buffer is None else self._key_buffer[..., : self.length, :]

    @keys.setter
    def keys(self, value):
        if value is not None:
            raise AttributeError("BufferLayer: write through update(), keep() or write_row()")

    @property
    def values(self):
        return None if self._value_buffer is None else self._value_buffer[..., : self.length, :]

    @values.setter
    def values(self, value):
        if value is not None:
            raise AttributeError("BufferLayer: write through update(), keep() or write_row()")

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.is_initialized = True

    def _reserve(self, like_keys: torch.Tensor, like_values: torch.Tensor, batch: int, needed: int) -> None:
        """Make room for ``needed`` columns (doubling), keeping the used ones."""
        if self._key_buffer is not None and self._key_buffer.shape[-2] >= needed:
            return
        capacity = max(needed, 64, 2 * (0 if self._key_buffer is None else self._key_buffer.shape[-2]))
        keys = like_keys.new_zeros((batch, like_keys.shape[1], capacity, like_keys.shape[-1]))
        values = like_values.new_zeros((batch, like_values.shape[1], capacity, like_values.shape[-1]))
        if self._key_buffer is not None and self.length:
            keys[..., : self.length, :] = self._key_buffer[..., : self.length, :]
            values[..., : self.length, :] = self._value_buffer[..., : self.length, :]
        self._key_buffer, self._value_buffer = keys, values

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append ``key_states``/``value_states`` ``[batch, kv_heads, n, head_dim]`` to every row."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        count = key_states.shape[-2]
        self._reserve(key_states, value_states, key_states.shape[0], self.length + count)
        self._key_buffer[..., self.length : self.length + count, :] = key_states
        self._value_buffer[..., self.length : self.length + count, :] = value_states
        self.length += count
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def write_row(self, row: int, batch: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Put one row's entries ``[1, kv_heads, n, head_dim]`` at columns 0..n−1 of ``row``
        (a prefill computed alone); the buffer holds ``batch`` rows."""
        if not self.is_initialized:
            self.lazy_initialization(keys, values)
        count = keys.shape[-2]
        self._reserve(keys, values, batch, max(self.length, count))
        self._key_buffer[row, :, :count] = keys[0]
        self._value_buffer[row, :, :count] = values[0]
        self.length = max(self.length, count)

    def keep(self, source: torch.Tensor, start: int, length: int) -> None:
        """Rewrite columns start..start+k−1 (k = ``source.shape[1]``) of every row from the
        columns ``source[b, j]`` of the same row, then use ``length`` columns.
        # source [batch, k] long"""
        if self._key_buffer is None or source.shape[1] == 0:
            self.length = length
            return
        index = source[:, None, :, None].expand(-1, self._key_buffer.shape[1], -1, self._key_buffer.shape[-1])
        kept_keys = self._key_buffer.gather(2, index)
        kept_values = self._value_buffer.gather(2, index)
        self._key_buffer[..., start : start + source.shape[1], :] = kept_keys
        self._value_buffer[..., start : start + source.shape[1], :] = kept_values
        self.length = length

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only the batch rows ``rows`` (sequences that finished leave)."""
        if self._key_buffer is not None:
            self._key_buffer = self._key_buffer.index_select(0, rows)
            self._value_buffer = self._value_buffer.index_select(0, rows)


class SpeculativeCache(Cache):
    """A transformers ``Cache`` of ``BufferLayer``s, one per decoder layer."""

    def __init__(self, num_layers: int):
        super().__init__(layers=[BufferLayer() for _ in range(num_layers)])

    @property
    def length(self) -> int:
        """Columns in use (the same in every layer)."""
        return self.layers[0].length

    def write_row(self, row: int, batch: int, layers) -> None:
        """One row's prefill: ``layers`` yields (keys, values) per layer."""
        for layer, (keys, values) in zip(self.layers, layers):
            layer.write_row(row, batch, keys, values)

    def keep(self, source: torch.Tensor, start: int, length: int) -> None:
        for layer in self.layers:
            layer.keep(source, start, length)

    def select_rows(self, rows: torch.Tensor) -> None:
        for layer in self.layers:
            layer.select_rows(rows)
