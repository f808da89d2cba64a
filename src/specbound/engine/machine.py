"""What identifies this machine, a file and a model on it, for the caches and records keyed
by them (the cost book, the quantised copies, the AMX probe's verdicts, the benchmarks'
records): the processor's model and flags (or the GPU), a file's identity and a loaded torch
model's. Imports no torch (the AMX probe's parent reads them before any model loads): a GPU's
name imports it when asked for."""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path


def cpu_description() -> dict:
    """The processor's model name and flags, from /proc/cpuinfo (what ``lscpu`` prints)."""
    description = {"model": platform.processor() or platform.machine(), "flags": ""}
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return description
    for line in lines:
        key, _, value = line.partition(":")
        field = {"model name": "model", "flags": "flags"}.get(key.strip())
        if field and not description.get(f"_{field}"):
            description[field], description[f"_{field}"] = value.strip(), True
    return {"model": description["model"], "flags": description["flags"]}


def file_fingerprint(path: Path) -> str:
    """Name, size and modification time of a file: enough to tell one model file (or one
    build of a library) from another without reading a gigabyte."""
    status = path.stat()
    return hashlib.sha256(f"{path.resolve()}:{status.st_size}:{status.st_mtime_ns}".encode()).hexdigest()[:16]



def hardware_key(device="cpu") -> str:
    """The processor (model name and a hash of its flags) or, for a CUDA ``device``, the GPU's name."""
    if str(device).startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    description = cpu_description()
    return description["model"] + " " + hashlib.sha256(description["flags"].encode()).hexdigest()[:12]


def model_fingerprint(model) -> str:
    """A short hash of a torch model's configuration, dtype, parameter count and a sample of
    its weights: the same model loaded twice has the same fingerprint."""
    digest = hashlib.sha256()
    digest.update(json.dumps(model.config.to_dict(), sort_keys=True, default=str).encode())
    count = 0
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        count += tensor.numel()
        if tensor.device.type != "meta" and tensor.numel():
            digest.update(tensor.flatten()[:64].float().cpu().numpy().tobytes())
    digest.update(str(count).encode())
    return digest.hexdigest()[:16]
