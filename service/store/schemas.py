"""What the store returns: plain pydantic models the API turns into its public schemas."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from service.cost import CostEstimate
from service.status import trials_finished


class SweepInfo(BaseModel):
    """A sweep with its trials' counts by status, progress and ETA."""

    id: int
    name: str
    description: str | None
    tags: list[str]
    status: str  # queued | running | completed | cancelled | failed
    priority: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    counts: dict[str, int] = Field(description="trials by status (every status present)")
    n_trials: int
    progress: float = Field(
        description="recorded epochs over expected epochs, 0..1; finished trials count in full"
    )
    eta_s: float | None = Field(
        description="seconds left (running sweeps, from elapsed time and progress), else null"
    )
    cancel_requested: bool
    runner_id: str | None
    error: str | None
    spec: dict[str, Any] = Field(description="the validated SweepSpec")
    estimate: CostEstimate | None = Field(
        None, description="what its own (not reused) trials cost: epochs, flops, seconds"
    )

    @property
    def trials_done(self) -> int:
        """Trials no longer queued or running (finished, reused ones included). A plain property:
        it is not a field, so model_dump() and the API's JSON do not change."""
        return trials_finished(self.counts)


class TrialInfo(BaseModel):
    """One trial: its config, state, progress and the last recorded epoch's scalar metrics."""

    id: int
    sweep_id: int
    index: int = Field(description="position in the sweep's expansion")
    config: dict[str, Any] = Field(description="the resolved TrialConfig")
    config_hash: str
    status: str  # queued | running | completed | diverged | failed | cancelled
    attempts: int
    error: str | None
    started_at: datetime | None
    finished_at: datetime | None
    epochs_done: int = Field(
        description="epochs trained by the stored records of the current (or reused) run: its "
        "last recorded epoch, 0 before any (epoch 0 is the untrained network's record)"
    )
    epochs_total: int = Field(description="epochs a full run trains: config.epochs")
    records_done: int = Field(
        description="records stored by the current (or reused) run, epoch 0's included"
    )
    records_total: int = Field(
        description="records a full run writes: len(config.recorded_epochs), epoch 0 included"
    )
    last_epoch: int | None  # highest epoch stored
    diverged_epoch: int | None
    results_from: int | None = Field(description="the trial whose stored results this reuses")
    summary: dict[str, float]  # scalar metrics of the last recorded epoch (NaN/±inf as floats)
