#!/usr/bin/env bash
# Forward cost vs rows of target- and draft-shaped models on a CUDA GPU, and the tokens/s
# the planner predicts on them, in one short run (benchmarks/engine/gpu_check.py; about a minute,
# stopped at 8). Runs as a lent GPU machine is: python3 with torch (a CUDA build) and
# transformers 5.x, numpy and scipy, from this source tree (PYTHONPATH=src, nothing
# installed, nothing fetched, no model file: the models are built from the default pair's
# shapes with random weights; the acceptance comes from a record in benchmarks/results).
#
#   benchmarks/engine/gpu_check.sh OUT_FOLDER [--device cuda] [--shapes qwen2.5-coder|tiny] [--repeats 5]
#
# Writes OUT_FOLDER/forward_rows_cuda.jsonl and OUT_FOLDER/gpu_check.json and prints the
# tables. `--device cpu --shapes tiny` runs it in seconds on any machine (the test suite does).
# PYTHON names the interpreter (default python3).
set -euo pipefail
out="${1:?usage: benchmarks/engine/gpu_check.sh OUT_FOLDER [--device cuda] [--shapes qwen2.5-coder|tiny]}"
shift
root="$(cd "$(dirname "$0")/../.." && pwd)"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
PYTHONPATH="$root/src:$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 \
    timeout 480 "${PYTHON:-python3}" -m benchmarks.engine.gpu_check --output "$out" "$@"
