"""Shared pytest fixtures."""

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import settings

# Property-based tests are deterministic in CI: derandomised, a fixed number of examples,
# no per-example deadline (the first example pays for imports and torch warm-up).
settings.register_profile("specbound", derandomize=True, database=None, max_examples=100, deadline=None, print_blob=True)
settings.load_profile("specbound")


# The groups that take longest, longest first. The workers take groups in collection order
# (``--no-loadscope-reorder``, pyproject.toml), each the next one when it is nearly done, so
# starting the long ones first lets the workers finish together; xdist's own order (most tests
# first) left a single long test to the end of one worker while the other sat idle.
LONGEST_GROUPS = (
    "serve",
    "engine/test_llamacpp_backend.py",
    "studies/test_study_acceptance.py",
    "engine/test_engine_lossless.py",
    "studies/test_study_multistep.py",
    "studies/test_crash_consistency.py",
    "bounds/test_optimal_acceptance.py",
    "verifiers/test_verifier_properties.py",
    "audit/test_audit_zoo.py",
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Which tests share a pytest-xdist worker (``--dist loadgroup``, pyproject.toml): a test
    file's tests share one, so its module fixtures are built once; the serve tests share one
    with each other, so their session servers start once and run in file order (the drain test,
    which stops the small server, after the tests that use it). Then the order the groups are
    handed out in: ``LONGEST_GROUPS`` first, the others by their number of tests, most first;
    a group's tests keep their order."""
    root = Path(__file__).parent
    groups = {}
    for item in items:
        relative = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else str(item.path)
        group = "serve" if relative.startswith("serve/") else relative
        item.add_marker(pytest.mark.xdist_group(group))
        groups.setdefault(group, []).append(item)
    first = {group: rank for rank, group in enumerate(LONGEST_GROUPS)}
    ordered = sorted(groups.items(), key=lambda named: (first.get(named[0], len(first)), -len(named[1])))
    items[:] = [item for _, group_items in ordered for item in group_items]


@pytest.fixture
def rng():
    return np.random.default_rng(20241130)


@pytest.fixture(scope="session", autouse=True)
def single_thread_session():
    """One torch thread from the start of the session, so that module and session fixtures
    (built before any test's ``single_thread``) run on one too: the workers already fill the
    cores, and two threads each on two shared cores slow a tiny model's forwards many times over."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def single_thread():
    """Tiny models run fastest on one thread (and do not fight other processes); a test that
    sets another count leaves one thread to the next."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
