"""The chaos run's schedule (processor/tools/chaos.py): the outages spread and interleaved,
the kills at random times that never fall inside an outage, the same schedule for a seed."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from processor.tools.chaos_fleet import PROCESSOR, WORKER
from processor.tools.chaos_plan import ChaosPlan, expected_s, schedule
from processor.tools.chaos_report import BROKER, FREEZE, LOCK, POSTGRES


def test_the_long_plan_interleaves_its_outages_and_spreads_its_kills() -> None:
    faults = schedule(ChaosPlan(), random.Random(1))
    assert [f.kind for f in faults if f.kind not in (PROCESSOR, WORKER)] == [
        BROKER,
        POSTGRES,
        FREEZE,
        LOCK,
    ]
    kinds = [f.kind for f in faults if f.kind in (PROCESSOR, WORKER)]
    assert len(kinds) == 60 and {PROCESSOR, WORKER} <= set(kinds)


@given(
    seed=st.integers(0, 10_000),
    kills=st.integers(0, 80),
    restarts=st.integers(0, 3),
    freeze_s=st.sampled_from([0.0, 5.0, 30.0]),
    lock_s=st.sampled_from([0.0, 20.0]),
)
def test_kills_fall_between_outages_in_time_order(
    seed: int, kills: int, restarts: int, freeze_s: float, lock_s: float
) -> None:
    plan = ChaosPlan(
        kills=kills,
        broker_restarts=restarts,
        postgres_restarts=restarts,
        freeze_s=freeze_s,
        lock_s=lock_s,
    )
    faults = schedule(plan, random.Random(seed))
    assert faults == schedule(plan, random.Random(seed))
    assert [f.at_s for f in faults] == sorted(f.at_s for f in faults)
    outages = [
        (f.at_s, f.at_s + expected_s(f.kind, plan))
        for f in faults
        if f.kind not in (PROCESSOR, WORKER)
    ]
    assert len(outages) == 2 * restarts + (1 if freeze_s else 0) + (1 if lock_s else 0)
    killed_at = [f.at_s for f in faults if f.kind in (PROCESSOR, WORKER)]
    assert len(killed_at) == kills
    assert all(0 < t <= plan.duration_s for t in killed_at)
    assert not [t for t in killed_at for start, end in outages if start < t < end]
