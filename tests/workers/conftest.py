"""Engine tests run torch on one thread: these networks are tiny, and on a loaded machine extra
OpenMP threads spin-wait for a core (10× slower). Restored after each test.

`ray_local`: one local Ray instance (2 CPUs, no dashboard) for the whole session, started by the
first test that asks for it (the driver's and the runner's Ray tests), shut down at the end."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def ray_local():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()
