"""Engine test fixtures: tiny models (see ``engine_fixtures``), one torch thread."""

import pytest
import torch

from engine_fixtures import noisy_copy, tiny_model


@pytest.fixture(autouse=True)
def single_thread():
    """Tiny models run fastest on one thread (and do not fight other processes)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def target_model():
    return tiny_model(seed=0)


@pytest.fixture(scope="session")
def draft_model(target_model):
    return noisy_copy(target_model, seed=1, noise=0.7)
