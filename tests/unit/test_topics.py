"""Topic names and the delay ladder (processor/topics.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.core.routing import (
    DELAY_RUNGS_MS,
    TIERS,
    TopicNames,
    requeue_delay_ms,
    rung_for_delay,
)
from processor.io.config.settings import Settings
from processor.io.kafka.topics import desired_topics, replication

from .strategies import FAST


def test_the_ladder_is_100ms_doubling_capped_at_10s() -> None:
    assert [requeue_delay_ms(n) for n in range(10)] == [
        100,
        200,
        400,
        800,
        1600,
        3200,
        6400,
        10000,
        10000,
        10000,
    ]
    assert requeue_delay_ms(10**6) == 10_000
    with pytest.raises(ValueError, match="requeue_number"):
        requeue_delay_ms(-1)


@FAST
@given(st.integers(0, 10**9))
def test_every_requeue_delay_is_a_rung(n: int) -> None:
    delay = requeue_delay_ms(n)
    assert delay in DELAY_RUNGS_MS
    assert rung_for_delay(delay) == delay


@pytest.mark.parametrize(
    ("delay", "rung"),
    [
        (-5, 100),
        (0, 100),
        (99, 100),
        (100, 100),
        (199, 100),
        (200, 200),
        (9_999, 6_400),
        (10_000, 10_000),
        (86_400_000, 10_000),
    ],
)
def test_rung_for_delay_examples(delay: int, rung: int) -> None:
    assert rung_for_delay(delay) == rung


@FAST
@given(st.integers(-1000, 10**8))
def test_rung_for_delay_is_the_largest_rung_not_longer_than_the_wait(delay: int) -> None:
    rung = rung_for_delay(delay)
    assert rung in DELAY_RUNGS_MS
    if delay >= DELAY_RUNGS_MS[0]:
        assert rung <= delay
        assert all(r <= rung or r > delay for r in DELAY_RUNGS_MS)
    else:
        assert rung == DELAY_RUNGS_MS[0]


@FAST
@given(st.integers(-1000, 10**6), st.integers(-1000, 10**6))
def test_rung_for_delay_is_monotone(a: int, b: int) -> None:
    if a <= b:
        assert rung_for_delay(a) <= rung_for_delay(b)


def test_topic_names() -> None:
    names = TopicNames("dx")
    assert names.wakeup("t0") == "dx.wakeup.t0"
    assert names.delay(400) == "dx.delay.400"
    assert names.steps == "dx.steps"
    assert names.dlq == "dx.dlq"
    assert names.requests == "dx.requests"
    assert names.tier_of(names.requests) == "requests"
    assert names.wakeup_topics() == ["dx.wakeup.t0", "dx.wakeup.t1", "dx.wakeup.t2"]
    assert names.delay_topics() == [f"dx.delay.{r}" for r in DELAY_RUNGS_MS]
    assert names.coordinator_topics() == [
        *names.wakeup_topics(),
        *names.delay_topics(),
        names.requests,
    ]
    for tier in TIERS:
        assert names.tier_of(names.wakeup(tier)) == tier
    for rung in DELAY_RUNGS_MS:
        assert names.tier_of(names.delay(rung)) == "delay"
        assert names.rung_of(names.delay(rung)) == rung
    with pytest.raises(ValueError, match="unknown tier"):
        names.wakeup("t3")
    with pytest.raises(ValueError, match="not a rung"):
        names.delay(300)
    for topic in ("dx.steps", "dx.dlq", "other.wakeup.t0", "dx.wakeup.t9"):
        with pytest.raises(ValueError, match="not a coordinator topic"):
            names.tier_of(topic)


def test_desired_topics_use_the_configured_partition_counts() -> None:
    settings = Settings(
        topic_prefix="p",
        wakeup_partitions=5,
        delay_partitions=5,  # equal to the wakeup partitions (config.py refuses others)
        step_partitions=4,
        dlq_partitions=2,
    )
    topics = desired_topics(settings)
    assert len(topics) == 3 + len(DELAY_RUNGS_MS) + 3 + 2  # the steps topics: one per tier
    assert topics["p.steps"] == topics["p.steps.default.t0"] == topics["p.steps.default.t2"] == 4
    assert topics["p.wakeup.t2"] == 5
    assert topics["p.requests"] == 5  # partitioned by run id like the wakeups
    assert topics["p.delay.10000"] == 5
    assert topics["p.steps"] == 4
    assert topics["p.dlq"] == 2


@pytest.mark.parametrize(
    ("brokers", "factor", "min_isr", "expected"),
    [
        (1, 0, 0, (1, 1)),
        (2, 0, 0, (2, 1)),
        (3, 0, 0, (3, 2)),
        (5, 0, 0, (3, 2)),
        (5, 5, 0, (5, 2)),
        (3, 3, 3, (3, 3)),
        (3, 2, 0, (2, 1)),
    ],
)
def test_new_topics_are_replicated_as_the_cluster_allows(
    brokers: int, factor: int, min_isr: int, expected: tuple[int, int]
) -> None:
    settings = Settings(replication_factor=factor, min_insync_replicas=min_isr)
    assert replication(settings, brokers) == expected


@pytest.mark.parametrize(
    ("brokers", "factor", "min_isr", "words"),
    [(1, 3, 0, "needs 3 brokers"), (3, 3, 4, "no write would ever be acknowledged")],
)
def test_replication_the_cluster_cannot_hold_is_refused(
    brokers: int, factor: int, min_isr: int, words: str
) -> None:
    settings = Settings(replication_factor=factor, min_insync_replicas=min_isr)
    with pytest.raises(RuntimeError, match=words):
        replication(settings, brokers)
