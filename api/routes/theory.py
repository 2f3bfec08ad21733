"""What the theory predicts: an activation's Hermite coefficients and β, and a trial's whole
epoch-0 record at infinite width (`POST /theory/predict`, service.theory.predict)."""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from api.errors import ERROR_RESPONSES, JSON_BODY_RESPONSES
from api.schemas import ActivationPublic, ActivationsPublic, Real
from service import theory
from service.activations import ACTIVATION_NAMES
from service.config import parse_trial_config
from service.errors import InvalidInput, LimitExceeded, NotFound

# What one request may ask of the server (a prediction costs ~depth·samples·n² flops).
PREDICT_DEPTH_MAX = 500
PREDICT_BATCH_MAX = 500
PREDICT_SAMPLES_MAX = 1 << 16

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


class PredictRequest(BaseModel):
    """A trial config (any TrialConfig fields; defaults for the rest) and optionally its probe
    batch."""

    model_config = ConfigDict(extra="forbid")

    config: dict[str, Any] = Field(description='TrialConfig fields, e.g. {"norm": "batch"}')
    inputs: list[list[float]] | None = Field(
        None, description="the probe batch (n, d_in); default: orthonormal unit-RMS inputs"
    )
    labels: list[Annotated[int, Field(ge=0, lt=2**31)]] | None = Field(
        None, description="its classes (n,), for the head's gradient"
    )
    samples: int = Field(
        theory.predict.__kwdefaults__["samples"],  # type: ignore[index]
        ge=256,
        le=PREDICT_SAMPLES_MAX,
        description="Monte Carlo draws per BatchNorm block",
    )
    seed: int = Field(0, ge=0, lt=2**31)


class PredictPublic(BaseModel):
    """Per-layer predictions with a trial record's keys, index ℓ − 1 (docs/science.md)."""

    config: dict[str, Any]
    layers: list[int]
    metrics: dict[str, list[Real]] = Field(description="metric → value per block ℓ = 1..L")
    unpredicted: dict[str, str] = Field(description="the family's other metrics, and why")
    notes: dict[str, Any]


@router.post(
    "/theory/predict",
    response_model=PredictPublic,
    responses={**ERROR_RESPONSES, **JSON_BODY_RESPONSES},
)
def predict_trial(body: PredictRequest) -> PredictPublic:
    """The mean-field prediction of a trial's epoch-0 record: rms, mean_cosine, the isometry gaps
    of every tap and grad_norm (relative to the last block's) for mlp and resmlp; the token
    metrics of an attention-only transformer in the uniform-attention limit."""
    config = parse_trial_config(body.config, where="config")
    limits = (("config.depth", config.depth, PREDICT_DEPTH_MAX),
              ("config.batch_size", config.batch_size, PREDICT_BATCH_MAX))  # fmt: skip
    for field, value, top in limits:
        if value > top:
            raise LimitExceeded(f"{value} is over {top}, this route's limit", field=field)
    inputs = None
    if body.inputs is not None:
        if len(body.inputs) > PREDICT_BATCH_MAX:
            raise LimitExceeded(f"more than {PREDICT_BATCH_MAX} rows", field="inputs")
        if len({len(row) for row in body.inputs}) > 1:
            raise InvalidInput("rows of different lengths", field="inputs")
        inputs = np.array(body.inputs, dtype=np.float64)
    labels = None if body.labels is None else np.array(body.labels, dtype=np.int64)
    p = theory.predict(config, inputs, labels=labels, samples=body.samples, seed=body.seed)
    metrics = {k: v.tolist() for k, v in p.items() if k not in ("unpredicted", "notes")}
    return PredictPublic(
        config=config.model_dump(),
        layers=list(range(1, config.depth + 1)),
        metrics=metrics,
        unpredicted=p["unpredicted"],
        notes=p["notes"],
    )
