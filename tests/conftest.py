"""Shared pytest fixtures."""

import numpy as np
import pytest
import torch


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
