"""The one status vocabulary of sweeps and trials.

    SweepStatus.RUNNING == "running"          # StrEnum members are their strings
    TrialStatus("diverged").is_finished()     # True

The members equal the strings stored in the database and sent by the API, so a status read back
as a plain string compares equal to its member, and nothing stored changes.

A sweep is `queued` (waiting for a runner), `running` (held by a runner under a lease), then
finished: `completed` (every trial completed or diverged), `failed` (some trial failed) or
`cancelled`. A trial is `queued`, `running`, then finished: `completed`, `diverged` (a
non-finite loss or metric; a result, and reusable like a completed one), `failed`,
`cancelled` or `stopped` (ended early by the spec's `early_stop` rule, service/search/halving.py:
its records stay, its `error` says at which rung and why; not reused as a result). A sweep whose
trials are completed, diverged or stopped is `completed`.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum


class SweepStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"

    def is_finished(self) -> bool:
        """Whether the sweep is over: nothing of it runs again."""
        return self not in (SweepStatus.QUEUED, SweepStatus.RUNNING)

    @classmethod
    def finished(cls) -> tuple[SweepStatus, ...]:
        """The finished statuses, in declaration order."""
        return tuple(s for s in cls if s.is_finished())


class TrialStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    DIVERGED = "diverged"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STOPPED = "stopped"  # early stopping (successive halving)

    def is_finished(self) -> bool:
        """Whether the trial is over (its attempt ended; only a new sweep runs it again)."""
        return self not in (TrialStatus.QUEUED, TrialStatus.RUNNING)

    @classmethod
    def finished(cls) -> tuple[TrialStatus, ...]:
        """The finished statuses, in declaration order."""
        return tuple(s for s in cls if s.is_finished())


def trials_finished(counts: Mapping[str, int]) -> int:
    """How many trials of a status → count mapping are finished (`SweepInfo.counts`, the API's
    `counts`): the one "done" count of progress bars and summaries. A status this version does
    not know (a newer server's) counts as finished: it is neither queued nor running."""
    unfinished = (TrialStatus.QUEUED, TrialStatus.RUNNING)
    return sum(n for s, n in counts.items() if s not in unfinished)
