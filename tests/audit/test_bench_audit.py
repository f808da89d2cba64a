"""``python -m benchmarks.audit.bench_audit --tiny`` runs every section on the tiny models and
writes one entry per audit (slow: it imports and runs each engine once)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_audit_benchmark_runs_every_section_at_a_tiny_size(tmp_path):
    pytest.importorskip("llama_cpp")
    output = tmp_path / "audit.json"
    subprocess.run([sys.executable, "-m", "benchmarks.audit.bench_audit", "--tiny", "--samples", "96",
                    "--max-new-tokens", "3", "--limit", "3", "--repeats", "2", "--threads", "1", "--output", str(output)],
                   check=True, timeout=600, capture_output=True, cwd=REPOSITORY)
    record = json.loads(output.read_text())["result"]
    # ours: the 8 audited methods on llama.cpp, TORCH_METHODS' 2 on torch
    assert [len(record[section]) for section in ("ours", "llama-cpp-python", "transformers", "power", "optimum")] == \
        [10, 2, 2, 14, 2]
    assert all(audit["passed"] for audit in record["ours"] + record["llama-cpp-python"])
    assert record["transformers"][0]["passed"]  # as it is; the raw-logits q needs more samples to fail
    assert all(optimum["every position"]["computed"] == optimum["every position"]["positions"]
               for optimum in record["optimum"])
