"""What a chaos run does and when (processor/tools/chaos.py): its plan, and the schedule of
its faults, drawn from the plan's seed."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from processor.tools.chaos_fleet import PROCESSOR, WORKER, Arming
from processor.tools.chaos_hostile import HostilePlan
from processor.tools.chaos_report import BROKER, FREEZE, LOCK, POSTGRES

_WARMUP_S = 3.0
# How long a broker takes to start on its data, and Postgres to restart, on the dev machine
# under load: the kills are spread over the time between the outages.
_BROKER_START_S = 12.0
_POSTGRES_RESTART_S = 1.0


@dataclass(frozen=True)
class ChaosPlan:
    runs: int = 3000
    duration_s: float = 150.0  # faults come within this; the runs are started over 80 % of it
    kills: int = 60  # SIGKILLs of processors and workers (the armed processors' come on top)
    worker_share: float = 1 / 3  # of the kills, the share that kills a worker
    arming: Arming = field(default_factory=Arming)
    broker_restarts: int = 1
    broker_down_s: float = 5.0  # how long the killed broker stays down before its restart
    postgres_restarts: int = 1
    freeze_s: float = 30.0  # 0: no freeze
    lock_s: float = 20.0  # a live run's row held FOR UPDATE from outside this long; 0: none
    lost_starts: int = 30  # runs inserted without their start wakeup
    processors: int = 3
    workers: int = 2
    copies: int = 3  # deliveries of each start wakeup
    # Every step's deadline, well above the group's session timeout (10 s locally: a killed
    # worker's tasks wait that long for another worker) and the freeze, as docs/guarantees.md
    # advises for production; the sample's own 10 s would let worker kills exhaust a step's
    # attempts, a configuration limit rather than the coordinator's.
    step_timeout_s: float = 60.0
    # After the last fault, for every run to end: the map run's 10,000 items end 3 minutes
    # after it on the 2-core dev machine, 8 when other work loads it (load 15: seed 4104).
    finish_timeout_s: float = 600.0
    seed: int = 0
    hostile: HostilePlan = field(default_factory=HostilePlan)


# The variant `make test` runs (tests/integration/test_chaos.py): about a minute.
SHORT = ChaosPlan(
    runs=300,
    duration_s=35.0,
    kills=10,
    arming=Arming(budget=3),
    broker_down_s=2.0,
    freeze_s=5.0,
    lock_s=5.0,
    lost_starts=10,
    finish_timeout_s=90.0,
    # A few dozen hostile records (every kind thrice) and a map of 1,000 items: CI's seconds.
    hostile=HostilePlan(records=51, map_items=1000),
)


@dataclass(frozen=True)
class PlannedFault:
    at_s: float  # from the start of the run
    kind: str  # BROKER, POSTGRES, FREEZE, PROCESSOR or WORKER (a SIGKILL of one)


def expected_s(kind: str, plan: ChaosPlan) -> float:
    """How long a fault of ``kind`` should take (a kill: no time)."""
    if kind == BROKER:
        return plan.broker_down_s + _BROKER_START_S
    if kind == POSTGRES:
        return _POSTGRES_RESTART_S
    if kind == LOCK:
        return plan.lock_s
    return plan.freeze_s if kind == FREEZE else 0.0


def schedule(plan: ChaosPlan, rng: random.Random) -> list[PlannedFault]:
    """The outages evenly spaced over the duration (interleaved: broker, postgres, freeze,
    broker...), and the kills at random times between them."""
    counts = {BROKER: plan.broker_restarts, POSTGRES: plan.postgres_restarts}
    counts[FREEZE] = 1 if plan.freeze_s > 0 else 0
    counts[LOCK] = 1 if plan.lock_s > 0 else 0
    kinds: list[str] = []
    for turn in range(max(counts.values())):
        kinds += [kind for kind, n in counts.items() if turn < n]
    span = plan.duration_s - _WARMUP_S
    outages = [
        PlannedFault(_WARMUP_S + span * (i + 1) / (len(kinds) + 1), k) for i, k in enumerate(kinds)
    ]
    busy = [(f.at_s, f.at_s + expected_s(f.kind, plan)) for f in outages]
    free: list[tuple[float, float]] = []
    cursor = _WARMUP_S
    for start, end in [*busy, (plan.duration_s, plan.duration_s)]:
        if start > cursor:
            free.append((cursor, start))
        cursor = max(cursor, end)
    total = sum(end - start for start, end in free)
    kills = []
    for _ in range(plan.kills):
        offset = rng.uniform(0, total)
        for start, end in free:
            if offset <= end - start:
                kind = WORKER if rng.random() < plan.worker_share else PROCESSOR
                kills.append(PlannedFault(start + offset, kind))
                break
            offset -= end - start
    return sorted([*outages, *kills], key=lambda f: f.at_s)
