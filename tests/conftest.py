"""Shared pytest fixtures."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import settings

# The engine's tiny models are one module under one name, ``engine_fixtures``, in every test
# folder (the studies, command-line and quantisation tests use them too), as it is in
# tests/engine, whose folder pytest puts on the path for its own test modules.
sys.path.insert(0, str(Path(__file__).parent / "engine"))

# Property-based tests are deterministic in CI: derandomised, a fixed number of examples,
# no per-example deadline (the first example pays for imports and torch warm-up).
settings.register_profile("specbound", derandomize=True, database=None, max_examples=100, deadline=None, print_blob=True)
settings.load_profile("specbound")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Which tests share a pytest-xdist worker (``--dist loadgroup``, pyproject.toml): a test
    file's tests share one, so its module fixtures are built once; the serve tests share one
    with each other, so their session servers start once and run in file order (the drain test,
    which stops the small server, after the tests that use it)."""
    root = Path(__file__).parent
    for item in items:
        group = "serve" if item.path.parent == root / "serve" else str(item.path)
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
def rng():
    return np.random.default_rng(20241130)


@pytest.fixture(autouse=True)
def single_thread():
    """Tiny models run fastest on one thread (and do not fight other processes)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
