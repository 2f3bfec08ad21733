"""The tables. A sweep has trials; a trial has metric rows (one per epoch and metric, holding the
whole per-layer vector as little-endian float64 bytes) and artifacts (e.g. the input Gram).

Why vectors in blobs: a depth-1000 trial records a dozen or more vectors of 1000 values per epoch
(service.models.layer_metrics: 13 for a BatchNorm MLP), hundreds of trials per sweep. One row per
value costs ~40 bytes of row and index overhead per 8-byte value and makes a 1000-layer history
read touch 100k rows; a blob row per (trial, metric, epoch) keeps the key at the granularity writes
and reads use, and raw IEEE-754 bytes round-trip NaN and ±inf bit-exactly on SQLite and Postgres
alike (bench/ingest.py measures the difference).

Changing a table here needs a new Alembic revision in migrations/versions/ (a test compares the
two).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from types import UnionType
from typing import TYPE_CHECKING, Any, Literal, Union, get_args, get_origin

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from service.config import CONFIG_FIELDS, TrialConfig
from service.status import SweepStatus, TrialStatus

# The status columns hold service.status values; these are the plain strings, in order (the
# API's enums, the `allowed` lists of errors).
SWEEP_STATUSES = tuple(s.value for s in SweepStatus)
TRIAL_STATUSES = tuple(s.value for s in TrialStatus)
FINISHED_TRIAL = tuple(s.value for s in TrialStatus.finished())

# Constraint names fixed by convention, so migrations can refer to them on every backend.
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator):
    """Timestamps stored as naive UTC (SQLite has no time zones) and read back as aware UTC."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        return value.replace(tzinfo=UTC) if value is not None else None


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class SqlSweep(Base):
    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str | None] = mapped_column(Text)
    tags: Mapped[list] = mapped_column(JSON)
    spec: Mapped[dict] = mapped_column(JSON)  # the validated SweepSpec, whole
    status: Mapped[str] = mapped_column(String(16))
    priority: Mapped[int] = mapped_column(Integer)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    runner_id: Mapped[str | None] = mapped_column(String(200))
    lease_s: Mapped[float | None] = mapped_column(Float)  # heartbeats extend the lease by this
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    error: Mapped[str | None] = mapped_column(Text)

    # claim_sweep's scan: queued/running sweeps by priority, then age
    __table_args__ = (Index(None, "status", "priority", "created_at"),)


class SqlTrial(Base):
    __tablename__ = "trials"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)  # position in the sweep's expansion
    config: Mapped[dict] = mapped_column(JSON)  # the resolved TrialConfig, whole
    config_hash: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    epochs_done: Mapped[int] = mapped_column(Integer, default=0)  # records of the current run
    epochs_total: Mapped[int] = mapped_column(Integer)  # len(config.recorded_epochs)
    last_epoch: Mapped[int | None] = mapped_column(Integer)  # highest epoch stored
    diverged_epoch: Mapped[int | None] = mapped_column(Integer)
    # The earlier trial whose stored results this one reuses (same config hash), or None.
    results_from: Mapped[int | None] = mapped_column(ForeignKey("trials.id"))
    summary: Mapped[dict | None] = mapped_column(JSON)  # last epoch's scalars, jsonfmt spelling
    if TYPE_CHECKING:  # for the type checker: config columns the store reads by name (below:
        # every TrialConfig field gets its column, made from the field's type)
        depth: Mapped[int]
        epochs: Mapped[int]
        record_every: Mapped[int]

    __table_args__ = (
        UniqueConstraint("sweep_id", "index"),
        Index(None, "sweep_id", "status"),
        Index(None, "config_hash", "status"),  # reuse lookups
    )


def config_column(name: str) -> Column:
    """The trials column of TrialConfig field `name`, from its type: int → Integer, float →
    Float, bool → Boolean, a Literal of names (or str) → String(32), a dict → JSON; nullable
    when the field may be None. No server default: the store writes every column, and a
    migration that adds one backfills the older rows (revision 0009 dropped the defaults that
    did it, so a migrated schema is this one)."""
    annotation, nullable = TrialConfig.model_fields[name].annotation, False
    if get_origin(annotation) in (Union, UnionType) and type(None) in get_args(annotation):
        (annotation,) = (a for a in get_args(annotation) if a is not type(None))
        nullable = True
    if annotation in SQL_TYPES:
        sql_type = SQL_TYPES[annotation]()
    elif annotation is str or get_origin(annotation) is Literal:
        sql_type = String(32)
    elif get_origin(annotation) is dict:
        sql_type = JSON()
    else:
        raise TypeError(f"TrialConfig.{name}: no column type for {annotation!r}")
    return Column(name, sql_type, nullable=nullable)


SQL_TYPES: dict[Any, Callable[[], Any]] = {bool: Boolean, int: Integer, float: Float}

# One column per TrialConfig field (service.config.CONFIG_FIELDS), derived from its type, so that
# `where` filters run in SQL. A test checks the migrations create the same columns.
for _name in CONFIG_FIELDS:
    setattr(SqlTrial, _name, config_column(_name))


class SqlMetric(Base):
    """One epoch of one metric of one trial: n float64 values (n = 1 for scalars)."""

    __tablename__ = "metrics"

    # The key is the idempotency key and the index of every read (trial → metric → epochs).
    trial_id: Mapped[int] = mapped_column(
        ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True
    )
    metric: Mapped[str] = mapped_column(String(64), primary_key=True)
    epoch: Mapped[int] = mapped_column(Integer, primary_key=True)
    n: Mapped[int] = mapped_column(Integer)  # values in `data`; lets reads count before decoding
    data: Mapped[bytes] = mapped_column(LargeBinary)  # little-endian float64, layer ℓ at ℓ−1


class SqlArtifact(Base):
    """A per-trial array that is not a per-epoch metric, e.g. the input Gram (n × n, float64)."""

    __tablename__ = "artifacts"

    trial_id: Mapped[int] = mapped_column(
        ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    shape: Mapped[list] = mapped_column(JSON)
    data: Mapped[bytes] = mapped_column(LargeBinary)  # little-endian float64, C order


class SqlSpectrum(Base):
    """One epoch of one per-epoch 2-D array of a trial (service.config.SPECTRUM_KEYS): the
    eigenvalues of every Gram of one kind, (L, n), or the Jacobian singular values, (k, m)."""

    __tablename__ = "spectra"

    trial_id: Mapped[int] = mapped_column(
        ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    epoch: Mapped[int] = mapped_column(Integer, primary_key=True)
    shape: Mapped[list] = mapped_column(JSON)  # [rows, columns]
    data: Mapped[bytes] = mapped_column(LargeBinary)  # little-endian float64, C order


class SqlLoginSession(Base):
    """A dashboard login (service/store/logins.py): the cookie holds a random key, this row its
    SHA-256 (a copy of the table opens no session), the tag of the token it was opened with
    (another token ends it), its times, and its revocation (logout, `isosweep sessions`)."""

    __tablename__ = "login_sessions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    token_tag: Mapped[str] = mapped_column(String(64))
    client: Mapped[str | None] = mapped_column(String(64))  # the address it logged in from
    user_agent: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_used_at: Mapped[datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
