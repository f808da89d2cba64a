"""Forward costs of target- and draft-shaped models on a GPU, and what ``auto`` plans on them.

A forward's cost depends on the model's shapes, its dtype and the machine, not on its
weights. So this builds Qwen2.5-Coder-1.5B- and 0.5B-shaped Qwen2 models (the default
pair's shapes, as their GGUF files give them) from their configurations with random weights,
in bf16 on ``--device``; measures each one's forward cost by rows with the engine's own probe
(``specbound.engine.cost_probe.measure_costs``: k new tree rows below a 200-token context, the
minimum over repeats) at every row count a method scores — the target's 1 + nodes of each
method's tree, the draft's rows of each drafted level, at the methods' defaults and the
planner's candidates; then hands the costs to the planner (``specbound.engine.planner``,
through ``plan_on_recorded_costs.plan``) with the single-draft acceptance recorded on CPU
for the real pair (chain γ = 6 on humaneval at T = 0.7, ``--acceptance-record``) and prints
plain decoding's and the chosen plan's predicted tokens/s.

It needs torch and transformers only (with numpy and scipy), from the source tree, no model
file and nothing fetched: ``benchmarks/engine/gpu_check.sh OUT_FOLDER`` runs it so. Writes
``forward_rows_<device>.jsonl`` (``bench_forward_rows``' format, which
``plan_on_recorded_costs --records`` reads) and ``gpu_check.json`` (a ``benchmarks.record``
envelope) to the folder ``--output``.
``--shapes tiny`` builds two small models instead (the test suite runs it on CPU).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from benchmarks import record
from benchmarks.engine.plan_on_recorded_costs import plan
from specbound.engine.cost_probe import measure_costs
from specbound.engine.costs import ROWS
from specbound.engine.methods import METHODS, Levels
from specbound.engine.planner import default_candidates

ACCEPTANCE_RECORD = record.RESULTS / "engine" / "humaneval_8x128.jsonl"
ACCEPTANCE_METHOD = "ours chain γ=6"

# (layers, hidden, intermediate, attention heads, key-value heads), vocabulary 151,936: the
# GGUF metadata of the embedded pair (qwen2.block_count, embedding_length, ...).
SHAPES = {
    "qwen2.5-coder": {"default-target": (28, 1536, 8960, 12, 2), "default-draft": (24, 896, 4864, 14, 2)},
    "tiny": {"default-target": (2, 64, 128, 4, 2), "default-draft": (1, 32, 64, 2, 1)},
}
VOCAB = {"qwen2.5-coder": 151_936, "tiny": 512}


def random_model(shape, vocab_size: int, device: str) -> torch.nn.Module:
    """A Qwen2 causal LM of ``shape`` with random weights, in bf16 on ``device``."""
    layers, hidden, intermediate, heads, kv_heads = shape
    config = Qwen2Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=32_768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device(device):
        return Qwen2ForCausalLM(config).to(torch.bfloat16).eval()


def methods_rows() -> list[int]:
    """Every row count a forward scores in the methods at their defaults and the planner's
    candidates: the target's pending token and all drafted nodes (1 + nodes), the draft's
    pending tokens (1 or 2) and each drafted level; with ``costs.ROWS``."""
    methods = [builder() for builder in METHODS.values()] + [candidate.build() for candidate in default_candidates()]
    rows = set(ROWS) | {1, 2}
    for method in methods:
        rows.add(1 + method.max_nodes)
        shape = method.shape
        if isinstance(shape, Levels):
            rows.update(math.prod(shape.branching[:depth]) for depth in range(1, shape.max_depth + 1))
        else:
            rows.update({shape.width, shape.nodes % shape.width} - {0})
    return sorted(rows)


def recorded_acceptance(path: Path, method: str) -> float:
    """P(a one-draft node's draft is accepted), pooled over every depth and prompt of
    ``method``'s records: from the accepted-length histograms, the drafts accepted over the
    drafts verified."""
    histogram = None
    for result in record.results(path):
        if result["method"] == method:
            counts = result["stats"]["accepted_length_histogram"]
            histogram = counts if histogram is None else [a + b for a, b in zip(histogram, counts)]
    if histogram is None:
        raise ValueError(f"--acceptance-record: {path} has no record of {method!r}")
    reached = [sum(histogram[depth:]) for depth in range(len(histogram))]  # steps that reach each depth
    return sum(reached[1:]) / sum(reached[:-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shapes", choices=sorted(SHAPES), default="qwen2.5-coder")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, help="torch's CPU threads (default: torch's own)")
    parser.add_argument("--acceptance-record", type=Path, default=ACCEPTANCE_RECORD)
    parser.add_argument("--output", type=Path, required=True, help="folder for the records")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"gpu_check: torch {torch.__version__} sees no CUDA device (--device cpu runs on the CPU)")
    acceptance = recorded_acceptance(args.acceptance_record, ACCEPTANCE_METHOD)
    rows = methods_rows()
    machine = record.machine()
    print(f"{machine.get('gpu') or machine['cpu_model']} | torch {torch.__version__} | shapes {args.shapes} | "
          f"rows {rows}")
    costs = {"target": {}, "draft": {}}
    path = args.output / f"forward_rows_{args.device.split(':')[0]}.jsonl"
    path.unlink(missing_ok=True)
    records = record.Lines(path)
    for name, shape in SHAPES[args.shapes].items():
        started = time.perf_counter()
        model = random_model(shape, VOCAB[args.shapes], args.device)
        measured = measure_costs(model, rows=rows, repeats=args.repeats)
        costs["target" if "target" in name else "draft"]["bf16"] = measured
        records.append({"model": name, "precision": "bf16", "rows_seconds": measured.to_json(), "shapes": args.shapes,
                        "weights": "random", "device": args.device, "threads": torch.get_num_threads()})
        cells = "  ".join(f"{count}: {seconds * 1000:.2f}" for count, seconds in measured.seconds.items())
        print(f"{name:15s} ms by rows  {cells}   ({time.perf_counter() - started:.0f} s)")
        del model
    plain, label, predicted = plan(costs, acceptance, ("bf16",))
    print(f"single-draft acceptance {acceptance:.3f} ({ACCEPTANCE_METHOD}, {args.acceptance_record.name})")
    print(f"planned: plain decoding {plain:.1f} tokens/s predicted; auto plans {label} at {predicted:.1f} "
          f"({predicted / plain:.2f}× plain)")
    summary = {"acceptance": acceptance, "acceptance_record": args.acceptance_record.name, "plain": plain,
               "plan": label, "predicted": predicted, "rows": rows, "settings": vars(args)}
    record.write(args.output / "gpu_check.json", summary)


if __name__ == "__main__":
    main()
