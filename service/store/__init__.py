"""The store: SQLAlchemy 2 models, sessions, Alembic migrations and the Store class."""

from service.store.schemas import SweepInfo, TrialInfo
from service.store.store import Store

__all__ = ["Store", "SweepInfo", "TrialInfo"]
