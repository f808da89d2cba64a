"""Engine test fixtures: tiny models (see ``support.models``)."""

import pytest

from support.models import noisy_copy, tiny_model


@pytest.fixture(scope="session")
def target_model():
    return tiny_model(seed=0)


@pytest.fixture(scope="session")
def draft_model(target_model):
    return noisy_copy(target_model, seed=1, noise=0.7)
