"""What the theory predicts for an activation: Hermite coefficients and β (service.theory)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from api.errors import ERROR_RESPONSES
from api.schemas import ActivationPublic, ActivationsPublic
from service import theory
from service.activations import ACTIVATION_NAMES
from service.errors import NotFound

router = APIRouter(tags=["theory"])

Gain = Annotated[
    float, Query(gt=0, le=theory.GAIN_MAX, description="input gain α: σ(α·x)", allow_inf_nan=False)
]
Terms = Annotated[
    int, Query(ge=1, le=theory.TERMS_MAX, description="highest Hermite coefficient index K")
]


@router.get("/theory/activations", response_model=ActivationsPublic, responses=ERROR_RESPONSES)
def read_activations(gain: Gain = 1.0, terms: Terms = 20) -> ActivationsPublic:
    """Every registered activation with its Hermite coefficients and β at one gain."""
    data = [ActivationPublic.model_validate(s) for s in theory.registry_summary(gain, terms)]
    return ActivationsPublic(data=data, count=len(data))


@router.get(
    "/theory/activations/{name}", response_model=ActivationPublic, responses=ERROR_RESPONSES
)
def read_activation(
    name: Annotated[
        str,
        Path(
            description="a registered activation",
            json_schema_extra={"enum": list(ACTIVATION_NAMES)},
        ),
    ],
    gain: Gain = 1.0,
    terms: Terms = 20,
) -> ActivationPublic:
    """Hermite coefficients c₀..c_K, β = 2 − c₁²/Σ_{k≥1} cₖ² and κ′(0) of σ(gain·x)."""
    if name not in ACTIVATION_NAMES:
        raise NotFound(f"no activation {name!r} (registered: {', '.join(ACTIVATION_NAMES)})")
    return ActivationPublic.model_validate(theory.activation_summary(name, gain, terms))
