"""Health of one processor instance, for an orchestrator's probes: what its poll loop reports,
served by io/runtime/health_http.py's server.

``GET /healthz`` (liveness): 200 while the poll loop keeps turning, 503 once it has not turned
for ``DUCTOR_HEALTH_STALL_S``, or once one of its threads died (the database stage's, the
request statement's, a sweep's, the presence heartbeat's: io/runtime/threads.py). Neither will
recover by itself; restarting the instance is safe (its uncommitted records are redelivered).

``GET /readyz`` (readiness): 200 when the instance owns partitions, the database answers and it
is neither starting (waiting for the broker or the database) nor shutting down; otherwise 503.
Both answer JSON saying why.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from processor.io.runtime.health_http import HealthServer
from processor.io.runtime.threads import ThreadWatch

__all__ = [
    "Probe",
    "is_ready",
    "probe_problems",
]


@dataclass
class Probe:
    """What the endpoints read of one instance; its poll loop keeps it up to date (plain
    attribute writes, read without a lock: a probe sees a value at most a turn old)."""

    instance_id: str
    last_loop_at: float = field(default_factory=time.monotonic)
    assigned_partitions: int = 0
    stopping: bool = False
    database_ok: bool = True  # False after a batch failed on a database error
    waiting_for: str | None = None  # at start: the dependency not answering yet
    threads: ThreadWatch = field(default_factory=ThreadWatch)  # the instance's own threads

    def problems(self, stall_s: float) -> list[str]:
        return probe_problems(self, stall_s)

    def broken(self) -> list[str]:
        return self.threads.problems()


def probe_problems(probe: Probe, stall_s: float) -> list[str]:
    """Why the instance is not ready, as far as its poll loop's own reports tell (the health
    server adds its database check)."""
    problems: list[str] = []
    if probe.waiting_for is not None:
        problems.append(f"starting: waiting for {probe.waiting_for}")
    if probe.stopping:
        problems.append("shutting down")
    if time.monotonic() - probe.last_loop_at > stall_s:
        problems.append("the poll loop is stalled")
    if probe.assigned_partitions == 0:
        problems.append("no partitions assigned")
    if not probe.database_ok:
        problems.append("the last batch failed on a database error")
    problems += probe.broken()
    return problems


def is_ready(probe: Probe, stall_s: float, server: HealthServer | None) -> bool:
    """The ``ductor.ready`` gauge: what ``/readyz`` answers when the health server runs, the
    probe's own reports when it does not (no database check of its own then)."""
    if server is not None:
        return server.readiness().ok
    return not probe_problems(probe, stall_s)
