"""What one forward costs as a function of its rows, per model and precision, on this machine.

Speculative decoding pays when the target scores k + 1 rows (a chain of k drafts, or a
tree of k nodes) for little more than one row, and the draft is cheap. This benchmark
measures, with the engine's own cost probe (``specbound.engine.costs.measure_costs``: one
forward of k tree rows below a 200-token context, the minimum over repeats), the target at
its precisions and the draft at bf16, int8 and int4 (``specbound.engine.backends.torch_quantize``), for
k = 1, 2, 4, 8, 16, 32; it also times plain decoding steps of the target through the
engine against transformers' own forward (the overhead outside the model) and records the
processor's model and flags with every result.

    python benchmarks/bench_forward_rows.py --threads 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import torch

from specbound.engine.backends.torch_quantize import quantize
from specbound.engine.costs import cpu_description, machine_key, measure_costs
from specbound.models.gguf import default_cache_dir
from specbound.models.loading import load_model


def lscpu() -> dict:
    try:
        output = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return cpu_description()
    fields = dict(line.split(":", 1) for line in output.splitlines() if ":" in line)
    return {"model": fields.get("Model name", "").strip(), "flags": fields.get("Flags", "").strip()}


def linear_fit(costs: dict[int, float]) -> tuple[float, float]:
    """Least squares cost(k) = a + b·k over the measured rows."""
    rows = torch.tensor(list(costs), dtype=torch.float64)
    seconds = torch.tensor(list(costs.values()), dtype=torch.float64)
    design = torch.stack([torch.ones_like(rows), rows], dim=1)
    a, b = torch.linalg.lstsq(design, seconds[:, None]).solution[:, 0].tolist()
    return a, b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--target-precisions", default="bf16")
    parser.add_argument("--draft-precisions", default="bf16,int8,int4")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (on a GPU only bf16 drafts: the int kernels are CPU's)")
    parser.add_argument("--output", default="benchmarks/results/forward_rows.jsonl")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else None
    machine = {"lscpu": lscpu(), "gpu": gpu, "machine_key": machine_key(args.device), "threads": args.threads,
               "torch": torch.__version__, "when": time.strftime("%Y-%m-%d %H:%M")}
    print(f"{gpu or machine['lscpu']['model']}, {args.threads} threads")
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    for name, precisions in (("default-target", args.target_precisions), ("default-draft", args.draft_precisions)):
        base = load_model(name, progress=False).model
        for precision in precisions.split(","):
            if args.device != "cpu" and precision != "bf16":
                continue
            model = quantize(base, precision, cache_dir=default_cache_dir()).to(args.device)
            costs = measure_costs(model, repeats=args.repeats).seconds
            a, b = linear_fit(costs)
            record = {"model": name, "precision": precision, "rows_seconds": costs, "fit": [a, b], **machine}
            with output.open("a") as handle:
                handle.write(json.dumps(record) + "\n")
            cells = "  ".join(f"{rows}: {seconds * 1000:.0f}" for rows, seconds in costs.items())
            print(f"{name:15s} {precision:5s} ms by rows  {cells}   fit {a * 1000:.0f} + {b * 1000:.1f}·k")
            del model
        del base


if __name__ == "__main__":
    main()
