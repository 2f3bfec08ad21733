"""Helpers for the API tests: small specs, submitting them, and writing hand-made records
(tests/records.py) through the Store (imported by the test modules as `api_support`)."""

from __future__ import annotations

from typing import Any

from records import record, unit_gram, value_of

__all__ = ["fill", "record", "run_trial", "spec", "submit", "unit_gram", "value_of"]


def spec(name: str = "s", seeds: int = 2, **parameters: Any) -> dict[str, Any]:
    """A small SweepSpec as JSON: defaults suited to hand-written records."""
    params = {"epochs": 2, "batch_size": 4, "width": 8, **parameters}
    return {"name": name, "parameters": params, "seeds": seeds}


def submit(api: Any, body: dict[str, Any], token: str | None = None) -> dict[str, Any]:
    """POST the spec (with the bearer token, if any); the sweep as JSON, checked to be a 201."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    r = api.post("/sweeps", json=body, headers=headers)
    assert r.status_code == 201, r.text
    return r.json()


def run_trial(
    api: Any,
    trial: Any,
    *,
    status: str = "completed",
    error: str | None = None,
    epochs: int | None = None,
    **last: Any,
) -> None:
    """Start the trial (a TrialInfo), write epochs 0..E (E: its config's epochs unless given;
    `last` overrides the record of epoch E), and finish it with `status` unless "running"."""
    api.store.start_trial(trial.id)
    E = trial.config["epochs"] if epochs is None else epochs
    depth = trial.config["depth"]
    batch = [
        (trial.id, record(trial.id, e, depth, **(last if e == E else {}))) for e in range(E + 1)
    ]
    api.store.write_records(batch)
    if status != "running":
        api.store.finish_trial(trial.id, status, error=error)


def fill(api: Any, sweep_id: int, epochs: int | None = None, gram: bool = True) -> list[dict]:
    """Write every epoch of every trial of the sweep; returns the trials (JSON)."""
    trials = api.get(f"/sweeps/{sweep_id}/trials", params={"limit": 1000}).json()["data"]
    batch = []
    for t in trials:
        c = t["config"]
        for e in range(c["epochs"] + 1 if epochs is None else epochs):
            extra = {"input_gram": unit_gram(c["batch_size"], c["seed"])} if gram and e == 0 else {}
            batch.append((t["id"], record(t["id"], e, c["depth"], **extra)))
    api.store.write_records(batch)
    return trials
