"""Cheaper drafts: weight-only int8 / int4 linear layers and a reduced vocabulary head.

Verification is exact whatever the draft computes, provided the verifier is handed the very
law the drafts were drawn from (SPEC.md §6) — so the draft model may run at any precision:
a coarser draft only changes how often its tokens are accepted, never what the target's
output law is. These transformations are meant for the draft; the target's precision is
the user's choice and never changed silently.

- ``int8``: per output channel symmetric, w ≈ s_row · q, q ∈ [−127, 127], through torch's
  CPU kernel ``_weight_int8pack_mm`` (fast at one or two rows, slower than bf16 at many);
- ``int4``: per group of 32 input weights asymmetric, w ≈ (q − 8)·s + z, q ∈ [0, 15],
  through ``_weight_int4pack_mm_for_cpu`` (layers whose inputs are not a multiple of 32,
  or outputs of 16, stay as they are); for each group the range is shrunk by the factor
  (from ``INT4_SHRINK``) that minimises the squared error — plain min/max rounding wastes
  levels on outliers and moved the default draft's next-token law by TV 0.155;
- ``reduce_head(model, keep)``: the output head computes only the logits of ``keep`` (the
  most frequent token ids); every other token gets −∞, so probability 0 — the draft never
  proposes it, which is lossless as above and costs only acceptance where the target puts
  mass outside ``keep``.

The precisions are named in ``engine.precisions``: ``AS_LOADED`` (the model itself), "int8"
and "int4" (the copies above).

Which precision pays is a property of the machine: measure it (``engine.planner``).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specbound.engine.machine import model_fingerprint
from specbound.engine.precisions import AS_LOADED, precision_name

INT4_GROUP = 32
INT4_SHRINK = tuple(1.0 - 0.025 * step for step in range(13))  # 1.0 down to 0.7


class _QuantizedLinear(torch.nn.Module):
    """Shape of a Linear without its weight: ``weight`` is a meta tensor of the original
    shape (callers read ``weight.shape`` — the vocabulary size of a head, say — and nothing
    else); ``dequantized()`` gives the weight the layer computes with. Built from a Linear
    (``from_linear``, which computes the quantisation) or from saved buffers."""

    def __init__(self, shape: tuple[int, int], dtype: torch.dtype, bias: torch.Tensor | None, buffers: dict):
        super().__init__()
        self.out_features, self.in_features = shape
        self.weight = torch.empty(shape, dtype=dtype, device="meta")
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().clone(), requires_grad=False)
        for name, tensor in buffers.items():
            self.register_buffer(name, tensor)

    def saved(self) -> dict:
        """Everything needed to rebuild the layer without quantising again."""
        return {name: tensor for name, tensor in self.named_buffers()} | ({} if self.bias is None else {"bias": self.bias})

    @staticmethod
    def fits(linear: torch.nn.Linear) -> bool:
        """Whether the kernel takes this layer's shape (others stay as they are)."""
        return True

    @classmethod
    def from_saved(cls, shape, dtype, tensors: dict) -> _QuantizedLinear:
        tensors = dict(tensors)
        bias = tensors.pop("bias", None)
        return cls(shape, dtype, bias, tensors)


class Int8Linear(_QuantizedLinear):
    """y = x Wᵀ + b with W stored as int8 per output channel (module docstring)."""

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear) -> Int8Linear:
        weight = linear.weight.detach().float()
        scales = weight.abs().amax(dim=1).clamp_min(1e-12) / 127.0
        levels = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8)
        return cls(tuple(linear.weight.shape), linear.weight.dtype, linear.bias,
                   {"weight_int8": levels, "scales": scales.to(linear.weight.dtype)})

    def dequantized(self) -> torch.Tensor:
        return self.weight_int8.to(self.scales.dtype) * self.scales[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        out = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, shape[-1]).to(self.scales.dtype), self.weight_int8,
                                                 self.scales)
        out = out.reshape(*shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias


def int4_grid(weight: torch.Tensor, group: int = INT4_GROUP, rows_per_chunk: int = 1024):
    """Per group of ``group`` input weights, the 16-level grid (scale s, zero z, levels q)
    that minimises the squared error among the ranges shrunk by ``INT4_SHRINK`` around the
    group's midpoint: w ≈ (q − 8)·s + z. Rows go in chunks (the search holds a few float32
    copies of a chunk).  # weight [out, in] -> s, z [out, in/group], q [out, in] int32"""
    scales, zeros, levels = [], [], []
    for start in range(0, weight.shape[0], rows_per_chunk):
        values = weight[start : start + rows_per_chunk].float()
        rows, columns = values.shape
        values = values.reshape(rows, columns // group, group)
        low, high = values.amin(-1), values.amax(-1)
        middle, half = (low + high) / 2, (high - low) / 2
        best_error = torch.full(low.shape, float("inf"))
        best_scale, best_low = torch.zeros_like(low), torch.zeros_like(low)
        for shrink in INT4_SHRINK:
            lower = middle - shrink * half
            scale = (2 * shrink * half / 15).clamp_min(1e-12)
            rounded = torch.round((values - lower[..., None]) / scale[..., None]).clamp_(0, 15)
            error = rounded.mul_(scale[..., None]).add_(lower[..., None]).sub_(values).square_().sum(-1)
            better = error < best_error
            best_error = torch.where(better, error, best_error)
            best_scale = torch.where(better, scale, best_scale)
            best_low = torch.where(better, lower, best_low)
        chunk_levels = torch.round((values - best_low[..., None]) / best_scale[..., None]).clamp(0, 15)
        scales.append(best_scale)
        zeros.append(best_low + 8 * best_scale)
        levels.append(chunk_levels.to(torch.int32).reshape(rows, columns))
    return torch.cat(scales), torch.cat(zeros), torch.cat(levels)


class Int4Linear(_QuantizedLinear):
    """y = x Wᵀ + b with W stored as 4-bit groups of ``INT4_GROUP`` (module docstring); CPU only."""

    @staticmethod
    def fits(linear: torch.nn.Linear) -> bool:
        """The kernel packs outputs in tiles of 16 and inputs in groups of ``INT4_GROUP``."""
        return linear.in_features % INT4_GROUP == 0 and linear.out_features % 16 == 0

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear) -> Int4Linear:
        scale, zero, levels = int4_grid(linear.weight.detach())
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(levels, 1)
        scales_and_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().to(linear.weight.dtype)
        return cls(tuple(linear.weight.shape), linear.weight.dtype, linear.bias,
                   {"weight_int4": packed, "scales_and_zeros": scales_and_zeros})

    def dequantized(self) -> torch.Tensor:
        """The weight the kernel computes with: run it on the identity."""
        eye = torch.eye(self.in_features, dtype=self.scales_and_zeros.dtype)
        return self.forward(eye).t() if self.bias is None else (self.forward(eye) - self.bias).t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.reshape(-1, shape[-1]).to(self.scales_and_zeros.dtype), self.weight_int4, INT4_GROUP,
            self.scales_and_zeros,
        )
        out = out.reshape(*shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias


class ReducedHead(torch.nn.Module):
    """The output head restricted to the token ids ``keep``: logits of the others are −∞.
    ``weight`` is a meta tensor of the original head's shape (vocabulary × hidden)."""

    def __init__(self, head: torch.nn.Module, keep: torch.Tensor, vocab_rows: int):
        super().__init__()
        self.register_buffer("keep", keep.to(torch.long))
        weight = head.weight.detach()[self.keep]
        self.head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=weight.dtype)
        self.head.weight = torch.nn.Parameter(weight.clone(), requires_grad=False)
        self.vocab_rows = vocab_rows
        self.weight = torch.empty((vocab_rows, weight.shape[1]), dtype=weight.dtype, device="meta")

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        kept = self.head(states)
        full = kept.new_full((*kept.shape[:-1], self.vocab_rows), float("-inf"))
        return full.index_copy_(-1, self.keep, kept)


LAYERS = {"int8": Int8Linear, "int4": Int4Linear}


def quantize(model: torch.nn.Module, precision: str, head: bool = True, cache_dir: Path | str | None = None):
    """A copy of ``model`` whose decoder Linear layers (and output head, with ``head``) run at
    ``precision`` (``engine.precisions``); ``AS_LOADED`` returns the model itself. CPU kernels only.

    Quantising the default draft to int4 takes minutes on two cores, so with ``cache_dir``
    the quantised layers are saved once (safetensors, keyed by the model's fingerprint, the
    precision and the torch version) and later loaded in seconds."""
    precision = precision_name(precision)
    if precision == AS_LOADED:
        return model
    if next(model.parameters()).device.type != "cpu":
        raise ValueError(f"precision: {precision} kernels are CPU kernels; on a GPU keep the model {AS_LOADED}")
    saved_path = None
    if cache_dir is not None:
        key = f"{model_fingerprint(model)}-{precision}{'' if head else '-nohead'}-torch{torch.__version__}"
        saved_path = Path(cache_dir) / "quantized" / f"{key}.safetensors"
    saved = None
    if saved_path is not None and saved_path.is_file():
        # fresh, aligned copies: the kernels read the packed weights with vector loads
        saved = {name: tensor.clone() for name, tensor in load_file(saved_path).items()}
    quantized = copy.deepcopy(model).eval()
    layer_class = LAYERS[precision]
    skipped = set() if head else {id(module) for module in quantized.get_output_embeddings().modules()}
    produced = {}
    for module_name, module in list(quantized.named_modules()):
        for name, child in list(module.named_children()):
            if not isinstance(child, torch.nn.Linear) or id(child) in skipped or not layer_class.fits(child):
                continue
            path = f"{module_name}.{name}" if module_name else name
            if saved is not None:
                tensors = {key.removeprefix(path + "."): value for key, value in saved.items() if key.startswith(path + ".")}
                layer = layer_class.from_saved(tuple(child.weight.shape), child.weight.dtype, tensors)
            else:
                layer = layer_class.from_linear(child)
                produced.update({f"{path}.{key}": value.contiguous() for key, value in layer.saved().items()})
            setattr(module, name, layer)
    if saved is None and saved_path is not None:
        saved_path.parent.mkdir(parents=True, exist_ok=True)
        temporary = saved_path.with_suffix(f".{os.getpid()}.partial")
        save_file(produced, str(temporary))
        os.replace(temporary, saved_path)
    return quantized


def precision_of(model: torch.nn.Module) -> str:
    """The precision of a torch model: that of its quantised layers (a ``quantize`` copy),
    else ``AS_LOADED``."""
    for module in model.modules():
        for precision, layer_class in LAYERS.items():
            if isinstance(module, layer_class):
                return precision
    return AS_LOADED


def reduce_head(model: torch.nn.Module, keep: int, always=()) -> torch.nn.Module:
    """A copy of ``model`` whose output head computes only the first ``keep`` token ids (in
    byte-pair tokenizers ids are in merge order, frequent first) and the ids ``always`` (the
    stop tokens)."""
    reduced = copy.deepcopy(model).eval()
    head = reduced.get_output_embeddings()
    rows = head.weight.shape[0]
    ids = torch.unique(torch.cat([torch.arange(min(keep, rows)), torch.tensor(sorted(always), dtype=torch.long)]))
    replacement = ReducedHead(head, ids, rows)
    reduced.set_output_embeddings(replacement)
    return reduced
