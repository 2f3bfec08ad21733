"""Engine tests run torch on one thread: these networks are tiny, and on a loaded machine extra
OpenMP threads spin-wait for a core (10× slower). Restored after each test."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
