"""The exact part's worker processes (``exact_part.ExactPool``) end with the study, however
it ends: a SIGKILL runs none of the study's cleanup, and workers left behind each held
their memory (~0.44 GB on real rows) and kept the resource tracker alive with them."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from Linux's /proc")

# A study's exact part in miniature: a pool of two workers that has run one unit (so the
# workers and the resource tracker of its shared memory are up), then waits to be killed.
STUDY = """
import sys
import numpy as np
from specbound.studies.exact_part import ExactPool
pool = ExactPool(2)
rows = np.full((4, 6), 1 / 6)
pool.exact(["single"], [1], 0.0, rows, rows)
print("ready", flush=True)
sys.stdin.read()
"""
GONE_WITHIN_SECONDS = 10.0


def children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended while listed
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped by its new parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_exact_pool_workers_and_resource_tracker_end_when_the_study_is_killed():
    study = subprocess.Popen([sys.executable, "-c", STUDY], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    left = []
    try:
        assert study.stdout.readline().strip() == "ready"
        left = children(study.pid)
        assert len(left) == 3  # two workers and the resource tracker
        study.kill()
        study.wait(timeout=10)
        deadline = time.monotonic() + GONE_WITHIN_SECONDS
        while any(map(alive, left)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in left if alive(pid)]
    finally:
        study.kill()
        study.wait(timeout=10)
        for pid in left:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
