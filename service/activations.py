"""The activation registry: one entry per name, shared by theory (numpy) and workers (torch).

Adding an activation here gives it a TrialConfig name, a torch implementation, Hermite
coefficients and an isometry strength β. A test checks that both implementations agree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946
LEAKY_SLOPE = 0.01  # torch's default negative slope
ELU_ALPHA = 1.0


@dataclass(frozen=True)
class Activation:
    """One activation σ. The network applies σ(α·x); theory expands x ↦ σ(α·x) in Hermite terms."""

    name: str
    numpy: Callable[[np.ndarray], np.ndarray]  # float64 in, float64 out
    # Given the torch module, return a callable on tensors (torch is bound lazily: service/ never
    # imports it).
    torch: Callable[[Any], Callable[[Any], Any]]
    breakpoints: tuple[float, ...] = ()  # where σ is not smooth (kinks, jumps), for quadrature
    params: dict[str, float] = field(default_factory=dict)
    formula: str = ""
    # Positively homogeneous: σ(a·x) = a^m·σ(x) for every a > 0. Centering and scaling remove the
    # factor a^m, so the theory (β, κ, the mean-field Grams) is the same at every gain.
    homogeneous: bool = False


def _gelu_np(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def _sigmoid_np(x: np.ndarray) -> np.ndarray:
    from scipy.special import expit

    return expit(x)  # keeps its relative accuracy for large negative x, unlike 1 + tanh


def _step_torch(torch):
    return lambda x: (x > 0).to(x.dtype)


_ENTRIES = [
    Activation("identity", lambda x: x, lambda t: lambda x: x, formula="x", homogeneous=True),
    Activation(
        "relu",
        lambda x: np.maximum(x, 0.0),
        lambda t: t.relu,
        (0.0,),
        formula="max(x, 0)",
        homogeneous=True,
    ),
    Activation(
        "leaky_relu",
        lambda x: np.where(x > 0, x, LEAKY_SLOPE * x),
        lambda t: lambda x: t.nn.functional.leaky_relu(x, LEAKY_SLOPE),
        (0.0,),
        {"negative_slope": LEAKY_SLOPE},
        "max(x, 0) + s·min(x, 0)",
        homogeneous=True,
    ),
    Activation("tanh", np.tanh, lambda t: t.tanh, formula="tanh(x)"),
    Activation("sigmoid", _sigmoid_np, lambda t: t.sigmoid, formula="1/(1+e^(−x))"),
    Activation("sin", np.sin, lambda t: t.sin, formula="sin(x)"),
    Activation("exp", np.exp, lambda t: t.exp, formula="e^x"),
    Activation("gelu", _gelu_np, lambda t: t.nn.functional.gelu, formula="x·Φ(x)"),
    Activation(
        "selu",
        lambda x: SELU_SCALE * np.where(x > 0, x, SELU_ALPHA * np.expm1(np.minimum(x, 0.0))),
        lambda t: t.nn.functional.selu,
        (0.0,),
        {"alpha": SELU_ALPHA, "scale": SELU_SCALE},
        "λ·(x if x>0 else a·(e^x−1))",
    ),
    Activation(
        "silu", lambda x: x * _sigmoid_np(x), lambda t: t.nn.functional.silu, formula="x·sigmoid(x)"
    ),
    Activation(
        "elu",
        lambda x: np.where(x > 0, x, ELU_ALPHA * np.expm1(np.minimum(x, 0.0))),
        lambda t: lambda x: t.nn.functional.elu(x, ELU_ALPHA),
        (0.0,),
        {"alpha": ELU_ALPHA},
        "x if x>0 else a·(e^x−1)",
    ),
    Activation(
        "softplus",
        lambda x: np.logaddexp(0.0, x),
        # torch switches to the identity above `threshold` (default 20: 1e-10 relative error)
        lambda t: lambda x: t.nn.functional.softplus(x, threshold=40.0),
        formula="log(1+e^x)",
    ),
    Activation(
        "step",
        lambda x: (x > 0).astype(np.float64),
        _step_torch,
        (0.0,),
        formula="1[x>0]",
        homogeneous=True,
    ),
]

ACTIVATIONS: dict[str, Activation] = {a.name: a for a in _ENTRIES}
ACTIVATION_NAMES: tuple[str, ...] = tuple(ACTIVATIONS)


def get_activation(name: str) -> Activation:
    """The registry entry for `name`.

    Raises:
        InvalidInput: unknown name (the message lists the registered ones).
    """
    from service.errors import InvalidInput

    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise InvalidInput(
            f"unknown activation {name!r}", field="activation", allowed=ACTIVATION_NAMES
        ) from None


def gain_schedule(gain: float, gain_exponent: float, depth: int) -> np.ndarray:
    """α_ℓ = α·ℓ^(−p), ℓ = 1..L, float64 (L,): the activation-shaping schedule (Meterez et al.
    2024, Sec. 5; p = 0.4 shapes tanh and sin). The one definition: the engine's workers.nn.gains
    and the theory's `layer_gains` both come from it. No range checks (the engine admits gains the
    quadrature does not). Python floats, not numpy's vectorized power: its SIMD pow differs from
    libm's by an ulp on long arrays, and the engine's gains must be these to the bit."""
    a, p = float(gain), -float(gain_exponent)
    return np.array([a * ell**p for ell in range(1, int(depth) + 1)], dtype=np.float64)
