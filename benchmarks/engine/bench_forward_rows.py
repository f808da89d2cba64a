"""What one forward costs as a function of its rows, per model and precision, on this machine.

Speculative decoding pays when the target scores k + 1 rows (a chain of k drafts, or a
tree of k nodes) for little more than one row, and the draft is cheap. This benchmark
measures, with the engine's own cost probe (``specbound.engine.cost_probe.measure_costs``: one
forward of k tree rows below a 200-token context, the minimum over repeats), the target at
its precisions and the draft at bf16, int8 and int4 (``specbound.engine.backends.torch_quantize``), for
k = 1, 2, 4, 8, 16, 32, with a least-squares line through them. One JSON line per (model,
precision) after the run's envelope (``benchmarks.record``: the machine).

    python -m benchmarks.engine.bench_forward_rows --threads 2
"""

from __future__ import annotations

import argparse

import torch

from benchmarks import record
from specbound.engine.backends.torch import machine_key
from specbound.engine.backends.torch_quantize import quantize
from specbound.engine.cost_probe import measure_costs
from specbound.models.gguf import default_cache_dir
from specbound.models.loading import load_model


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
    record.add_output(parser, "engine/forward_rows.jsonl")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    machine = record.machine()
    print(f"{machine.get('gpu') or machine['cpu_model']}, {args.threads} threads")
    output = record.Lines(args.output)
    settings = {"machine_key": machine_key(args.device), "device": args.device, "threads": args.threads}
    for name, precisions in (("default-target", args.target_precisions), ("default-draft", args.draft_precisions)):
        base = load_model(name, progress=False).model
        for precision in precisions.split(","):
            if args.device != "cpu" and precision != "bf16":
                continue
            model = quantize(base, precision, cache_dir=default_cache_dir()).to(args.device)
            costs = measure_costs(model, repeats=args.repeats).seconds
            a, b = linear_fit(costs)
            output.append({"model": name, "precision": precision, "rows_seconds": costs, "fit": [a, b], **settings})
            cells = "  ".join(f"{rows}: {seconds * 1000:.0f}" for rows, seconds in costs.items())
            print(f"{name:15s} {precision:5s} ms by rows  {cells}   fit {a * 1000:.0f} + {b * 1000:.1f}·k")
            del model
        del base


if __name__ == "__main__":
    main()
