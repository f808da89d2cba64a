"""Studies on Ray: a local Ray instance of two workers on the tiny pair writes, unit for unit
and byte for byte, the records of a local run with the same batch size; a Ray run resumes
and extends like a local one and its folder renders as a report; a worker killed mid-batch
has its units decoded again by another, and every unit is written exactly once. Without ray
installed, ``--ray`` says how to install it.

The tests on a Ray instance are ``slow`` (about a minute together: starting Ray takes ~3 s
and each worker process ~5 s, its imports and the tiny pair, before a unit is decoded):
``python -m pytest -m slow tests/studies/test_study_ray.py``. The fast suite keeps the
command line's side of ``--ray``, which starts no instance."""

import importlib.util
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from specbound.cli import main
from specbound.studies.acceptance import AcceptanceStudy
from specbound.studies.distributed import INSTALL_HINT, RayWorkers, run_study_on_ray
from specbound.studies.records import RECORDS_FILE, TIMINGS_FILE, read_results
from specbound.studies.report import write_report
from specbound.studies.runner import run_pending, run_study
from specbound.models.tiny import tiny_pair, tiny_prompts

RAY_INSTALLED = importlib.util.find_spec("ray") is not None  # ray itself is imported by the slow tests only


def on_ray(test):
    """A test on a local Ray instance: slow (module docstring), skipped without ray."""
    needs_ray = pytest.mark.skipif(not RAY_INSTALLED, reason="ray is not installed (pip install -e '.[distributed]')")
    return pytest.mark.slow(needs_ray(test))
OPTIONS = {"temperatures": (0.8, 1.0), "num_drafts": (2,), "max_new_tokens": 5}
TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def local_ray():
    """Two CPUs, a small object store, no dashboard; the workers import the test modules
    (the tiny pair's factory, the studies below) from the test folders."""
    import ray

    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    ray.init(num_cpus=2, object_store_memory=200 * 2**20, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path, "OMP_NUM_THREADS": "1"}})
    yield
    ray.shutdown()


def unit_lines(directory) -> dict[str, list[str]]:
    """Each unit's record lines, in order."""
    lines = {}
    for line in (Path(directory) / RECORDS_FILE).read_text().splitlines():
        lines.setdefault(json.loads(line)["unit"], []).append(line)
    return lines


class KilledOnce(AcceptanceStudy):
    """Its worker dies by SIGKILL (as the OOM killer or a lost node would end it) when it
    first reaches ``victim``; the marker file says it happened."""

    def __init__(self, victim, marker, **options):
        super().__init__(**options)
        self.victim, self.marker = victim, Path(marker)

    def run_units(self, pair, units, generators):
        if any(unit.key == self.victim for unit in units) and not self.marker.exists():
            self.marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return super().run_units(pair, units, generators)


@on_ray
def test_a_ray_run_writes_the_records_of_a_local_run(local_ray, tmp_path):
    prompts = tiny_prompts(4)
    run_study(AcceptanceStudy(**OPTIONS), tiny_pair(), prompts, tmp_path / "local", "toy", progress=False,
              batch_size=2)
    results = run_study_on_ray(AcceptanceStudy(**OPTIONS), tiny_pair, prompts, tmp_path / "ray", "toy",
                               batch_size=2, progress=False, num_workers=2, cpus_per_worker=1)
    assert (tmp_path / "ray" / RECORDS_FILE).read_bytes() == (tmp_path / "local" / RECORDS_FILE).read_bytes()
    assert unit_lines(tmp_path / "ray") == unit_lines(tmp_path / "local")
    assert len(results.runs) == 8 and set(results.timings) == {run["unit"] for run in results.runs}
    assert results.settings == read_results(tmp_path / "local").settings


@on_ray
def test_a_ray_run_resumes_extends_and_renders_like_a_local_one(local_ray, tmp_path):
    out = tmp_path / "results" / "acceptance" / "toy"
    with RayWorkers(tiny_pair, num_workers=2, cpus_per_worker=1) as workers:
        workers.run_study(AcceptanceStudy(**OPTIONS), tiny_prompts(2), out, "toy", progress=False)
        first = (out / RECORDS_FILE).read_bytes()
        workers.run_study(AcceptanceStudy(**OPTIONS), tiny_prompts(2), out, "toy", progress=False)
        assert (out / RECORDS_FILE).read_bytes() == first  # nothing left to do, nothing written
        workers.run_study(AcceptanceStudy(**OPTIONS), tiny_prompts(3), out, "toy", progress=False)
    assert (out / RECORDS_FILE).read_bytes().startswith(first)
    results = run_study(AcceptanceStudy(**OPTIONS), tiny_pair(), tiny_prompts(4), out, "toy", progress=False)
    assert len(results.runs) == 8

    run_study(AcceptanceStudy(**OPTIONS), tiny_pair(), tiny_prompts(4), tmp_path / "local", "toy", progress=False)
    assert unit_lines(out) == unit_lines(tmp_path / "local")
    report = write_report(tmp_path / "results").read_text()
    assert "Acceptance study" in report


@on_ray
def test_a_killed_workers_units_are_retried_and_written_once(local_ray, tmp_path):
    prompts = tiny_prompts(4)
    run_study(AcceptanceStudy(**OPTIONS), tiny_pair(), prompts, tmp_path / "local", "toy", progress=False,
              batch_size=2)
    victim = AcceptanceStudy(**OPTIONS).units(prompts)[2].key  # in the second batch
    study = KilledOnce(victim, tmp_path / "killed", **OPTIONS)
    results = run_study_on_ray(study, tiny_pair, prompts, tmp_path / "ray", "toy", batch_size=2, progress=False,
                               num_workers=2, cpus_per_worker=1)
    assert (tmp_path / "killed").exists()  # a worker did die mid-batch
    assert (tmp_path / "ray" / RECORDS_FILE).read_bytes() == (tmp_path / "local" / RECORDS_FILE).read_bytes()
    runs = [json.loads(line)["unit"] for line in (tmp_path / "ray" / RECORDS_FILE).read_text().splitlines()
            if json.loads(line)["kind"] == "run"]
    timed = [json.loads(line)["unit"] for line in (tmp_path / "ray" / TIMINGS_FILE).read_text().splitlines()]
    assert sorted(runs) == sorted(timed) == sorted(unit.key for unit in study.units(prompts))
    assert len(results.runs) == 8


@on_ray
def test_workers_that_die_too_often_stop_the_run_keeping_what_was_written(local_ray, tmp_path):
    prompts = tiny_prompts(2)
    study = KilledOnce(AcceptanceStudy(**OPTIONS).units(prompts)[1].key, tmp_path / "killed", **OPTIONS)
    with pytest.raises(RuntimeError, match="1 workers died"):
        run_study_on_ray(study, tiny_pair, prompts, tmp_path / "ray", "toy", batch_size=1, progress=False,
                         num_workers=1, cpus_per_worker=1, max_retries=0)
    assert len(read_results(tmp_path / "ray").runs) == 1  # the unit before the victim


def test_ray_flag_without_ray_says_how_to_install_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    status = main(["study", "acceptance", "--ray", "--limit", "1", "--out", str(tmp_path), "--quiet"])
    assert status == 2
    assert INSTALL_HINT in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before anything was loaded or written


@pytest.mark.parametrize("flag, address", [(["--ray"], "local"), (["--ray", "auto"], "auto")])
def test_ray_flag_joins_the_named_cluster_or_starts_a_local_one(monkeypatch, tmp_path, capsys, flag, address):
    calls = {}

    class FakeWorkers:
        def __init__(self, pair_spec, address=None):
            calls["address"], calls["target"] = address, pair_spec.args[0]

        def __enter__(self):
            return self

        def __exit__(self, *exception):
            calls["closed"] = True

        def batch_size(self):
            return 4

        def run_pending(self, study, writer, batch_size):
            calls["batch_size"] = batch_size
            return run_pending(study, tiny_pair(), writer, batch_size)

    monkeypatch.setattr("specbound.studies.distributed.RayWorkers", FakeWorkers)
    status = main(["study", "acceptance", *flag, "--dataset", str(write_prompts(tmp_path)), "--max-new-tokens", "3",
                   "--num-drafts", "2", "--workers", "1", "--out", str(tmp_path / "out"), "--quiet"])
    assert status == 0
    assert calls == {"address": address, "target": "default-target", "batch_size": 4, "closed": True}
    assert "batch size 4 (measured on a worker)" in capsys.readouterr().err


def write_prompts(directory: Path) -> Path:
    path = directory / "prompts.txt"
    path.write_text("ab\ncab\n")
    return path


def test_ray_flag_refuses_what_is_no_ray_address(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["study", "acceptance", "--ray", "no-port"])
    assert exit_info.value.code == 2
    assert "--ray" in capsys.readouterr().err
