"""A short-lived cache for the expensive reads (metric frames, rendered plots), so that many
dashboards polling one sweep cost one computation, not one each.

An entry is keyed by the request *and* the sweep's version (status, trial counts, progress),
so a new record, a finished trial or a status change makes a new key at once. A finished sweep
(completed, cancelled, failed) no longer changes: its entries live until evicted. Otherwise an
entry lives 2 s (service.single_flight.TTL_S), the most an answer can lag a change the version
does not show (an epoch rewritten in place by a retried trial). Concurrent misses of one key
compute it once ("single flight"); the others wait for that result or its error. Bounded in
bytes; least recently used entries go first (service.single_flight).
"""

from __future__ import annotations

from service.single_flight import SingleFlightCache
from service.status import SweepStatus
from service.store import SweepInfo

__all__ = ["SingleFlightCache", "sweep_version"]  # the cache class, for the API's modules


def sweep_version(info: SweepInfo) -> tuple:
    """What changes whenever a sweep's stored results or states do (from a SweepInfo); its
    first item says whether the sweep is finished (its entries never expire)."""
    counts = tuple(sorted(info.counts.items()))
    done = SweepStatus(info.status).is_finished()
    return (done, info.status, counts, info.progress, info.n_trials)
