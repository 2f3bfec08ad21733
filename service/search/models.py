"""The spec's adaptive parts (docs/api.md, "Adaptive search" and "Early stopping"):
`TpeSearch` (search: {kind: tpe, …}) and `EarlyStop` (early_stop: {kind: successive_halving,
…}). Plain pydantic models: no Optuna, no torch."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.config import LAYER_METRICS, METRICS, SCALAR_METRICS
from service.errors import InvalidInput

SEED_LIMIT = 2**31


def check_metric(metric: str, layer: int | None, where: str, key: str = "metric") -> None:
    """A metric a search or a stopping rule can read one number of: a scalar one, or a
    per-layer one with `layer` (ℓ ≥ 1).

    Raises:
        InvalidInput: naming `<where>.metric` (METRICS allowed) or `<where>.layer`.
    """
    if metric not in METRICS:
        raise InvalidInput("unknown metric", field=f"{where}.{key}", allowed=METRICS)
    if metric in LAYER_METRICS and layer is None:
        raise InvalidInput(
            f"{metric!r} is per-layer: say which layer with `layer: ℓ` (1 = the first block)",
            field=f"{where}.layer",
        )
    if metric in SCALAR_METRICS and layer is not None:
        raise InvalidInput(f"{metric!r} is a scalar: drop `layer`", field=f"{where}.layer")


class TpeSearch(BaseModel):
    """Optuna's TPE over the distribution parameters, asked and told as trials run; one study
    per grid cell and seed."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["tpe"]
    n: int = Field(ge=1, description="trials each study asks for (per grid cell and seed)")
    objective: str = Field(description="the metric told to the study (service.config.METRICS)")
    layer: int | None = Field(None, ge=1, description="for a per-layer objective: which layer")
    mode: Literal["min", "max"] = "min"
    epoch: Literal["last"] | int = Field(
        "last", description="the epoch whose value is told: last, or K (the last record ≤ K)"
    )
    seed: int = Field(0, ge=0, lt=SEED_LIMIT, description="seeds TPESampler")

    @model_validator(mode="after")
    def _check(self) -> TpeSearch:
        check_metric(self.objective, self.layer, "search", "objective")
        if isinstance(self.epoch, int) and (isinstance(self.epoch, bool) or self.epoch < 0):
            raise InvalidInput("last, or an epoch ≥ 0", field="search.epoch")
        return self


class EarlyStop(BaseModel):
    """Successive halving (service/search/halving.py): asynchronous (ASHA, the default) or
    synchronous (each rung decided once every trial that can reach it has)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["successive_halving"]
    metric: str = Field(description="the metric judged at each rung (service.config.METRICS)")
    layer: int | None = Field(None, ge=1, description="for a per-layer metric: which layer")
    mode: Literal["min", "max"] = "min"
    grace_epochs: int = Field(1, ge=1, description="G: the first rung's epoch")
    reduction: int = Field(2, ge=2, description="R: rungs at G·R^k; the top 1/R go on")
    synchronous: bool = Field(
        False,
        description="decide each rung once every trial that can reach it has: the same trials "
        "stop in every run of the spec (it waits for a rung's slowest trial, and a trial "
        "going on past a rung trains again from epoch 0); false: as trials arrive (ASHA)",
    )

    @model_validator(mode="after")
    def _check(self) -> EarlyStop:
        check_metric(self.metric, self.layer, "early_stop")
        return self


def metric_value(record: dict[str, Any], metric: str, layer: int | None) -> float | None:
    """The one number of `metric` (at `layer`) in an epoch record, or None when it has none."""
    v = record.get(metric)
    if v is None:
        return None
    if layer is not None:
        try:
            return float(v[layer - 1])
        except (IndexError, TypeError):
            return None
    return float(v)
