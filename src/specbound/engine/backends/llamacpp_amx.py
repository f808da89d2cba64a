"""Whether llama.cpp's AMX weight buffers compute correctly in this build, tried once.

llama.cpp stores a model's weights in *extra buffer types* where the CPU backend offers them:
on a CPU with AMX the ``AMX`` type (weights re-laid for the tile unit, multi-row products on
AMX tiles), and ``CPU_REPACK`` (interleaved layouts for AVX2 and NEON). The AMX kernels load
their tile configuration once per thread with ``_tile_loadconfig``; GCC 12.2's header
declares that instruction's 64-byte operand as an 8-byte one, so the compiler drops the
stores of the tile shapes as dead and the first tile instruction faults: a llama-cpp-python
built by that compiler on an AMX machine dies by SIGILL on the first forward of two or more
tokens (seen on an Intel Xeon with amx_int8 under Debian 12's GCC 12.2.0; the 1-token
forward takes a VNNI path and survives). The same source built there by clang 16 configures
its tiles and passes the probe; clang 14 builds no AMX kernels at all (it spells the feature
macro ggml tests for differently).

A crash cannot be caught in the process that runs it, so the verdict comes from a child
process: it writes a tiny model whose matrices AMX takes (Q8_0 and Q4_0, widths a multiple
of 32), loads it with and without the extra buffers, and checks that a 32-token forward
survives and gives the same logits both ways. The verdict is kept per build and CPU in
``<cache>/extra_buffers.json``, so the child runs once. Where the CPU backend offers no AMX
buffer no probe runs and the extra buffers are used as llama.cpp chooses.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from specbound.engine.machine import cpu_description, file_fingerprint

PROBED_TYPE = "AMX"  # the extra buffer type whose build is tried before use
PROBE_TOKENS = 32  # a forward of this many tokens takes AMX's tile path (one token takes VNNI's)
PROBE_SECONDS = 300
# the probe model's logits with and without the extra buffers may differ by the rounding of
# another summation order (both quantise the activations to 8 bits the same way): this share
# of their spread; a miscomputed product is off by the spread itself
LOGIT_TOLERANCE = 1e-2
VOCAB, WIDTH, HEADS, FFN = 256, 128, 4, 256


def _libraries():
    import llama_cpp

    folder = Path(llama_cpp.__file__).parent / "lib"
    return llama_cpp, folder


def cpu_extra_buffer_types() -> list[str]:
    """The names of the extra weight buffer types llama.cpp's CPU backend offers here
    (e.g. ``AMX``, ``CPU_REPACK``), read through ggml's device API; none where its libraries
    are not the Linux ones this reads (AMX is probed on Linux only)."""
    llama_cpp, folder = _libraries()
    llama_cpp.llama_backend_init()
    try:
        ggml = ctypes.CDLL(str(folder / "libggml.so"))
        base = ctypes.CDLL(str(folder / "libggml-base.so"))
    except OSError:
        return []
    ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    ggml.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
    base.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    base.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    base.ggml_backend_buft_name.restype = ctypes.c_char_p
    base.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
    device = ggml.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
    if not device:
        return []
    address = base.ggml_backend_reg_get_proc_address(ggml.ggml_backend_dev_backend_reg(device),
                                                     b"ggml_backend_dev_get_extra_bufts")
    if not address:
        return []
    extra_types = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(address)(device)
    names, index = [], 0
    while extra_types and extra_types[index]:
        names.append(base.ggml_backend_buft_name(extra_types[index]).decode())
        index += 1
    return names


def build_key() -> str:
    """This llama.cpp build on this CPU: the CPU library's identity (``file_fingerprint``),
    the CPU's model and flags."""
    _, folder = _libraries()
    cpu = cpu_description()
    text = f"{file_fingerprint(folder / 'libggml-cpu.so')}:{cpu['model']}:{cpu['flags']}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@functools.cache
def use_extra_buffers(cache_dir=None) -> bool:
    """Whether models should load with llama.cpp's extra buffer types: True where the CPU
    backend offers no AMX buffer, else the kept (or a new) probe's verdict, once per
    process. A build whose AMX kernels fail is told on stderr, with the remedy."""
    if PROBED_TYPE not in cpu_extra_buffer_types():
        return True
    verdict = probe_verdict(cache_dir)
    if not verdict["works"]:
        version = _libraries()[0].__version__
        print(f"specbound: llama.cpp's {PROBED_TYPE} kernels fail in this build of llama-cpp-python "
              f"({verdict['detail']}); its models load without extra buffer types. Built by clang 16, "
              "they run on AMX: CC=clang-16 CXX=clang++-16 pip install --force-reinstall --no-deps --no-cache-dir "
              f"llama-cpp-python=={version}", file=sys.stderr)
    return verdict["works"]


def probe_verdict(cache_dir=None) -> dict:
    """The probe's verdict for this build and CPU, ``{"works": bool, "detail": str}``, kept
    in ``<cache>/extra_buffers.json`` (one writer at a time: a file lock)."""
    from filelock import FileLock

    from specbound.paths import default_cache_dir

    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    path, key = cache / "extra_buffers.json", build_key()
    with FileLock(str(path) + ".lock"):
        kept = json.loads(path.read_text()) if path.is_file() else {}
        if key not in kept:
            kept[key] = run_probe()
            temporary = path.with_suffix(".tmp")
            temporary.write_text(json.dumps(kept, indent=1, sort_keys=True))
            temporary.replace(path)
    return kept[key]


def run_probe(timeout: float = PROBE_SECONDS) -> dict:
    """Run the probe in a child process (``python -m specbound.engine.backends.llamacpp_amx``)."""
    with tempfile.TemporaryDirectory(prefix="specbound-probe-") as folder:
        try:
            child = subprocess.run([sys.executable, "-m", __name__, folder], capture_output=True, text=True,
                                   timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"works": False, "detail": f"the probe did not finish in {timeout:.0f} s"}
    if child.returncode < 0:
        return {"works": False, "detail": f"a {PROBE_TOKENS}-token forward was killed by "
                                          f"{signal.Signals(-child.returncode).name}"}
    lines = child.stdout.strip().splitlines()
    if child.returncode != 0 or not lines:
        return {"works": False, "detail": f"the probe exited {child.returncode}: {child.stderr.strip()[-300:]}"}
    return json.loads(lines[-1])


def write_probe_model(path: Path, seed: int = 0) -> Path:
    """A one-layer llama-architecture GGUF with random Q8_0 and Q4_0 matrices, every width a
    multiple of 32 (AMX's tile width), no tokenizer (ids only)."""
    import gguf

    generator = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("specbound-probe")
    writer.add_context_length(256)
    writer.add_embedding_length(WIDTH)
    writer.add_block_count(1)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("none")
    writer.add_vocab_size(VOCAB)

    def matrix(name: str, rows: int, columns: int, kind) -> None:
        values = generator.standard_normal((rows, columns)).astype(np.float32) / np.sqrt(columns)
        writer.add_tensor(name, gguf.quants.quantize(values, kind), raw_dtype=kind)

    Q8, Q4 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0
    writer.add_tensor("token_embd.weight", generator.standard_normal((VOCAB, WIDTH)).astype(np.float32))
    writer.add_tensor("output_norm.weight", np.ones(WIDTH, np.float32))
    matrix("output.weight", VOCAB, WIDTH, Q8)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(WIDTH, np.float32))
    writer.add_tensor("blk.0.ffn_norm.weight", np.ones(WIDTH, np.float32))
    for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
        matrix(f"blk.0.{name}.weight", WIDTH, WIDTH, Q8)
    matrix("blk.0.ffn_gate.weight", FFN, WIDTH, Q4)
    matrix("blk.0.ffn_up.weight", FFN, WIDTH, Q4)
    matrix("blk.0.ffn_down.weight", WIDTH, FFN, Q8)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def probe_logits(path: Path, extra_buffers: bool) -> np.ndarray:
    """The probe model's logits at every one of ``PROBE_TOKENS`` tokens, in one forward.
    # -> [PROBE_TOKENS, VOCAB]"""
    llama_cpp, _ = _libraries()
    llama_cpp.llama_backend_init()
    parameters = llama_cpp.llama_model_default_params()
    parameters.n_gpu_layers = 0
    parameters.use_extra_bufts = extra_buffers
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), parameters)
    if not model:
        raise RuntimeError(f"llama.cpp could not load the probe model {path}")
    settings = llama_cpp.llama_context_default_params()
    settings.n_ctx = settings.n_batch = settings.n_ubatch = 256
    context = llama_cpp.llama_init_from_model(model, settings)
    batch = llama_cpp.llama_batch_init(PROBE_TOKENS, 0, 1)
    try:
        for index in range(PROBE_TOKENS):
            batch.token[index] = (7 * index + 3) % VOCAB
            batch.pos[index] = index
            batch.n_seq_id[index] = 1
            batch.seq_id[index][0] = 0
            batch.logits[index] = True
        batch.n_tokens = PROBE_TOKENS
        if llama_cpp.llama_decode(context, batch) != 0:
            raise RuntimeError("llama_decode failed on the probe model")
        pointer = llama_cpp.llama_get_logits(context)
        return np.ctypeslib.as_array(pointer, shape=(PROBE_TOKENS * VOCAB,)).reshape(PROBE_TOKENS, VOCAB).copy()
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(context)
        llama_cpp.llama_model_free(model)


def _probe(folder: str) -> dict:
    """The child's work: both forwards, compared (a crash ends the process before any print)."""
    path = write_probe_model(Path(folder) / "probe.gguf")
    plain = probe_logits(path, extra_buffers=False)
    extra = probe_logits(path, extra_buffers=True)
    difference = float(np.max(np.abs(extra - plain)))
    spread = float(np.std(plain))
    if not np.all(np.isfinite(extra)) or difference > LOGIT_TOLERANCE * spread:
        return {"works": False, "detail": f"logits differ from the plain buffers' by {difference:.3g} "
                                          f"(spread {spread:.3g})"}
    return {"works": True, "detail": f"logits within {difference:.3g} of the plain buffers' (spread {spread:.3g})"}


if __name__ == "__main__":
    print(json.dumps(_probe(sys.argv[1])), flush=True)
