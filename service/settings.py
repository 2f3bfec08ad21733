"""One typed settings class; every value can be set with an `ISOSWEEP_` environment variable."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

LOOPBACK_HOSTS = ["localhost", "127.0.0.1", "[::1]", "::1"]


def default_data_dir() -> Path:
    """$XDG_DATA_HOME/isosweep/data, i.e. ~/.local/share/isosweep/data by default: one place
    whatever directory `serve`, `run` or `trial` starts in."""
    home = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return (Path(home) / "isosweep" / "data").resolve()


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ISOSWEEP_", extra="ignore")

    database_url: str = "sqlite:///isosweep.db"  # SQLite file in the working directory
    # torchvision datasets are read from (and downloaded to) here; absolute once loaded (a
    # relative ISOSWEEP_DATA_DIR is taken from the working directory at start-up).
    data_dir: Path = Field(default_factory=default_data_dir)
    # Trials may download a missing torchvision set. Off: a sweep using a set whose files are
    # not under data_dir is refused at submit (service.datasets), naming the files.
    allow_download: bool = False
    host: str = "127.0.0.1"  # the API binds to loopback unless told otherwise
    port: int = Field(8000, ge=1, le=65535)
    api_token: str | None = None  # when set, requests need `Authorization: Bearer …`
    # Host header allow-list (names without port; "*" allows any). A DNS-rebinding page reaches
    # the API under its own name, so only the names the API is really served under belong here.
    # From the environment: comma-separated (ISOSWEEP_ALLOWED_HOSTS=lab.example.org,localhost).
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: list(LOOPBACK_HOSTS)
    )
    open_reads: bool = False  # with a token set, reads (GET/HEAD) need no token
    allow_open: bool = False  # `isosweep serve` beyond loopback with no token refuses unless set

    # Limits that protect the machine; a spec over one is rejected naming the field.
    max_trials_per_sweep: int = Field(100_000, ge=1)
    max_depth: int = Field(5000, ge=1)
    max_width: int = Field(8192, ge=1)
    max_batch_size: int = Field(65536, ge=1)
    max_epochs: int = Field(100_000, ge=0)
    max_trial_memory_gb: float = Field(
        64.0, gt=0
    )  # estimate: weights, grads, optimizer, activations
    # A sweep whose estimated time (service.cost) is over this is refused unless its spec says
    # `accept_cost: true`.
    max_sweep_hours: float = Field(24.0, gt=0)

    # Bounds on reads and requests.
    max_points: int = Field(2_000_000, ge=1)  # most values one metrics query may return
    max_page_size: int = Field(1000, ge=1)
    # Heavy reads (metrics JSON/CSV/Parquet, plots) computed at once, in the whole process, and
    # how many more may wait for one of those slots; one more is a 503 with Retry-After. A plot
    # not drawn within plot_timeout_s (waiting included) is a 504 (it goes on in the
    # background, within the same bound, and its result is cached for the retry).
    max_heavy_reads: int = Field(4, ge=1)
    heavy_read_queue: int = Field(64, ge=0)
    plot_timeout_s: float = Field(30.0, gt=0)
    max_body_bytes: int = Field(1_000_000, ge=1)

    # TF32 on CUDA (matmuls, convolutions): faster training, ~1e-3 relative on what is measured
    allow_tf32: bool = False
    # Modules imported at start that register a lab's own models (service/models.py,
    # docs/models.md); comma-separated from the environment. A spec can only name a model that
    # these (or the `isosweep.models` entry points) registered: it never makes the server import.
    model_modules: Annotated[list[str], NoDecode] = Field(default_factory=list)

    runner_poll_s: float = Field(2.0, gt=0)  # how often an idle runner looks for queued sweeps
    runner_lease_s: float = Field(60.0, gt=0)  # a running sweep without a heartbeat this long
    # is taken over by another runner (the first one died)
    # `isosweep serve` restarts a runner whose driver loop made no progress this long
    runner_stall_s: float = Field(600.0, gt=0)

    # The dashboard's login sessions (api/dashboard/login.py): each ends this long after login,
    # at logout, by `isosweep sessions revoke`, or when the token changes.
    session_ttl_s: float = Field(7 * 86400.0, gt=0)
    # Failed logins (the form, or a wrong bearer token) within login_window_s: past this many
    # from one address, or from all together, a 429 with Retry-After and nothing is compared.
    login_failures_per_address: int = Field(10, ge=1)
    login_failures_total: int = Field(100, ge=1)
    login_window_s: float = Field(60.0, gt=0)

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, v: object) -> object:
        if isinstance(v, str):  # from the environment; "" (as docker compose passes) = default
            return [h.strip() for h in v.split(",") if h.strip()] or list(LOOPBACK_HOSTS)
        return v

    @field_validator("model_modules", mode="before")
    @classmethod
    def _split_modules(cls, v: object) -> object:
        if isinstance(v, str):
            return [m.strip() for m in v.split(",") if m.strip()]
        return v

    @field_validator("data_dir")
    @classmethod
    def _absolute_data_dir(cls, v: Path) -> Path:
        return v.expanduser().resolve()

    @field_validator("api_token")
    @classmethod
    def _empty_token_is_none(cls, v: str | None) -> str | None:
        return v or None  # ISOSWEEP_API_TOKEN="" (as docker compose passes it) means no token


@lru_cache
def get_settings() -> Settings:
    return Settings()
