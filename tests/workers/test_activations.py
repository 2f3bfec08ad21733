"""The activation registry: each entry's torch and numpy implementations are one function."""

import numpy as np
import pytest
import torch

from service.activations import ACTIVATION_NAMES, ACTIVATIONS

# Negative, small, around the kinks, and large enough that a naive exp/log1p formula overflows.
GRID = np.concatenate(
    [
        np.linspace(-30.0, 30.0, 601),
        [-700.0, -80.0, -1e-8, 0.0, 1e-8, 80.0, 700.0],
        np.linspace(-1e-3, 1e-3, 11),
    ]
)


@pytest.mark.parametrize("name", ACTIVATION_NAMES)
def test_torch_and_numpy_agree(name):
    act = ACTIVATIONS[name]
    x = GRID if name != "exp" else GRID[GRID < 700]  # e^700 overflows float64 in both
    ref = act.numpy(x.copy())
    got = act.torch(torch)(torch.from_numpy(x.copy())).numpy()
    assert got.shape == ref.shape and got.dtype == np.float64
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("name", ACTIVATION_NAMES)
def test_float32_torch_close_to_float64_numpy(name):
    """The network runs in float32: the torch function must not lose more than rounding."""
    act = ACTIVATIONS[name]
    x = np.linspace(-20.0, 20.0, 401)
    ref = act.numpy(x)
    got = act.torch(torch)(torch.from_numpy(x).float()).double().numpy()
    if name == "step":  # discontinuous at 0: compare away from it
        keep = np.abs(x) > 1e-6
        got, ref = got[keep], ref[keep]
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=2e-6 * np.abs(ref).max())


@pytest.mark.parametrize(
    "name, x, expected",
    [
        ("relu", [-2.0, 3.0], [0.0, 3.0]),
        ("leaky_relu", [-2.0, 3.0], [-0.02, 3.0]),
        ("step", [-2.0, 0.0, 3.0], [0.0, 0.0, 1.0]),
        ("sigmoid", [0.0], [0.5]),
        ("softplus", [0.0], [np.log(2.0)]),
        ("elu", [-np.log(2.0)], [-0.5]),
        ("gelu", [0.0, 1.0], [0.0, 0.8413447460685429]),  # x·Φ(x)
    ],
)
def test_known_values(name, x, expected):
    x = np.asarray(x)
    for impl in (
        ACTIVATIONS[name].numpy,
        lambda v: ACTIVATIONS[name].torch(torch)(torch.tensor(v)),
    ):
        np.testing.assert_allclose(np.asarray(impl(x)), expected, rtol=1e-12, atol=1e-15)
