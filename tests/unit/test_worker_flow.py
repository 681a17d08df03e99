"""The worker's task flow without Kafka, Postgres or threads (worker/assembly.py builds it):
its requests to the database lanes are collected as the typed values they are, the lanes'
and the slots' answers are scripted, a fake runner stands for the slots, and a ManualClock
moves time, so the deadline watch, the heartbeat timeout, back-pressure and the broker's
acknowledgements are judged in microseconds; so are the loop's own times (turns.py)."""

from __future__ import annotations

import logging
import queue
import time
from collections import Counter
from typing import Any

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE

from processor.core.claims import ClaimVerdict
from processor.core.model import StepOutcome
from processor.core.routing import TopicNames
from processor.core.step_task import StepData, encode_task
from processor.io.kafka.delivery import Delivery
from processor.io.postgres.db_clock import DatabaseClock
from processor.io.postgres.step_attempts import Report
from processor.io.runtime.clock import ManualClock
from processor.io.runtime.faults import NO_FAULTS
from processor.io.runtime.outage import Outage
from processor.io.runtime.threads import ThreadWatch
from processor.io.telemetry.setup import Telemetry
from processor.worker.assembly import FlowParts, build_flow
from processor.worker.claiming import RECLAIM_AFTER_S
from processor.worker.flow import HELD_PER_SLOT
from processor.worker.lane_batches import gather_claims
from processor.worker.messages import (
    CheckCurrent,
    Claimed,
    ClaimReruns,
    ClaimTasks,
    Ended,
    News,
    NotCurrent,
    Over,
    Permitted,
    Recorded,
    RecordResults,
    ReportExecutions,
    Request,
    StorePermit,
    TaskClaim,
    Unclaim,
)
from processor.worker.options import WorkerOptions
from processor.worker.stats import WorkerStats
from processor.worker.steps import AttemptResult, StepRegistry
from processor.worker.tasks import State, Task
from processor.worker.turns import BUSY_WAIT_S, IDLE_POLL_S, WATCH_EVERY_S, Turns
from processor.worker.watch import CURRENT_CHECK_EVERY_S

from .fakes import FakeMessage

TOPIC = "ductor.steps.default.t1"
NAMES = TopicNames("ductor")


class Record(FakeMessage):
    def timestamp(self) -> tuple[int, int]:
        return (TIMESTAMP_NOT_AVAILABLE, 0)


class Slots:
    """The runner: keeps what it is handed; ``abandon`` frees the slot (the step runs on)."""

    def __init__(self) -> None:
        self.submitted: list[Task] = []
        self.abandoned: list[Task] = []

    def submit(self, task: Task) -> None:
        self.submitted.append(task)

    def abandon(self, task: Task) -> None:
        task.abandoned = True
        self.abandoned.append(task)

    def abandoned_alive(self) -> int:
        return len(self.abandoned)

    def close(self) -> None:
        pass


class Broker:
    """What Delivery sends to: keeps the records; ``ack`` acknowledges them."""

    def __init__(self) -> None:
        self.records: list[tuple[str, bytes | None]] = []
        self._reports: list[Any] = []

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        on_delivery: Any,
        partition: int | None = None,
        headers: Any = None,
    ) -> None:
        self.records.append((topic, value))
        self._reports.append(on_delivery)

    def ack(self) -> None:
        reports, self._reports = self._reports, []
        for report in reports:
            report(None, None)


class Harness:
    def __init__(self, concurrency: int = 2, prefetch: int = 4, abandon_after_s: float = 5.0):
        # (the wall clock starts at the real one: an attempt's ``cancelled`` reads the real)
        self.manual = ManualClock(wall_ms=time.time_ns() // 1_000_000)
        self.requests: list[Request] = []
        self.answers: queue.SimpleQueue[News] = queue.SimpleQueue()
        self.slots = Slots()
        self.broker = Broker()
        self.done: list[tuple[tuple[str, int], int]] = []
        self.stopped = 0
        self.kafka = Outage("kafka", logging.getLogger("test"))
        self.options = WorkerOptions(
            concurrency=concurrency,
            prefetch=prefetch,
            abandon_after_s=abandon_after_s,
            reruns_in_child=False,
        )
        parts = FlowParts(
            options=self.options,
            registry=StepRegistry(),
            names=NAMES,
            stats=WorkerStats(),
            telemetry=Telemetry(),
            clock=self.manual.clock,
            db_clock=DatabaseClock(),
            answers=self.answers,
            ask=self.requests.append,
            delivery=Delivery(self.broker, Counter(), self.manual.clock.monotonic, self.kafka),
            flush=lambda _s: 0,
            kafka_outage=self.kafka,
            done_offset=lambda tp, offset: self.done.append((tp, offset)),
            too_many_abandoned=self._too_many,
            partition_by_run=True,
            shutdown_timeout_s=5.0,
            dlq_max_bytes=1 << 20,
            faults=NO_FAULTS,
            threads=ThreadWatch(),
        )
        self.stats = parts.stats
        self.flow = build_flow(parts, runners={"sync": self.slots, "async": self.slots})
        self.flow.wakeup_partitions(dict.fromkeys(NAMES.wakeup_topics(), 4))
        self._offset = 0

    def _too_many(self) -> None:
        self.stopped += 1

    @property
    def now(self) -> float:
        return self.manual.clock.monotonic()

    def take(self, n: int, **task: Any) -> None:
        for _ in range(n):
            self._offset += 1
            run_id = f"run-{self._offset}"
            value = encode_task(
                run_id,
                "s",
                1,
                "fast",
                self.manual.clock.wall_ms() + 60_000,
                "t1",
                (),
                None,
                **task,
            )
            self.flow.intake(Record(TOPIC, self._offset, value, 0))  # type: ignore[arg-type]

    def asked(self, kind: type[Any]) -> list[Any]:
        """The requests of ``kind`` asked since the last look (and forgets them all)."""
        mine = [r for r in self.requests if isinstance(r, kind)]
        self.requests.clear()
        return mine

    def answer(self, *answers: News) -> None:
        for a in answers:
            self.answers.put(a)
        self.flow.take_answers(0.0)

    def running(self, n: int, **task: Any) -> list[Task]:
        """``n`` tasks taken in, claimed, permitted and started on their slots now."""
        self.take(n, **task)
        self.flow.ask()
        (claim,) = self.asked(ClaimTasks)
        self.answer(
            Claimed([TaskClaim(t, ClaimVerdict.RUN, 1, StepData(None)) for t in claim.tasks]),
            Permitted(max(t.claim_seq for t in claim.tasks)),
        )
        self.flow.ask()
        started = self.slots.submitted[-n:]
        for t in started:  # what a slot does as it begins (runners.begin)
            t.started_ns = int(self.now * 1e9)
            t.handle.beat_at = self.now
            if t.step.timeout_ms is not None:
                t.handle.deadline_ms = self.manual.clock.wall_ms() + t.step.timeout_ms
        return started


def _recorded(h: Harness) -> list[tuple[Task, AttemptResult]]:
    h.flow.ask()
    return [(r.task, r.outcome) for req in h.asked(RecordResults) for r in req.results]


# -- the deadline watch -------------------------------------------------------------------------


def test_a_step_past_its_timeout_and_grace_is_abandoned_and_its_attempt_fails() -> None:
    h = Harness(abandon_after_s=5.0)
    (task,) = h.running(1, timeout_ms=2_000)
    h.manual.advance(2.0 + 5.0)  # at its deadline plus the grace: not yet
    h.flow.watch(h.now)
    assert h.slots.abandoned == [] and _recorded(h) == []
    h.manual.advance(0.1)
    h.flow.watch(h.now)
    assert h.slots.abandoned == [task] and h.stats.abandoned == 1
    [(recorded, outcome)] = _recorded(h)
    assert recorded is task and outcome.outcome is StepOutcome.FAILED
    assert outcome.error == "attempt 1 timed out after 2000 ms"


def test_a_silent_step_is_abandoned_past_its_heartbeat_timeout() -> None:
    h = Harness()
    (task,) = h.running(1, heartbeat_timeout_ms=3_000)
    h.manual.advance(2.0)
    task.handle.heartbeat()
    task.handle.beat_at = h.now  # (a step beats on the real monotonic clock)
    h.manual.advance(2.9)
    h.flow.watch(h.now)
    assert h.slots.abandoned == []
    h.manual.advance(0.2)
    h.flow.watch(h.now)
    assert h.slots.abandoned == [task]
    [(_t, outcome)] = _recorded(h)
    assert outcome.error is not None and outcome.error.startswith("abandoned: no heartbeat for")


def test_long_running_steps_are_asked_about_once_a_second() -> None:
    h = Harness()
    tasks = h.running(2)
    h.requests.clear()
    h.manual.advance(CURRENT_CHECK_EVERY_S / 2)
    h.flow.watch(h.now)
    assert h.asked(CheckCurrent) == []  # not long-running yet
    h.manual.advance(CURRENT_CHECK_EVERY_S)
    h.flow.watch(h.now)
    (check,) = h.asked(CheckCurrent)
    assert check.tasks == tasks
    h.manual.advance(CURRENT_CHECK_EVERY_S / 2)
    h.flow.watch(h.now)
    assert h.asked(CheckCurrent) == []  # asked a moment ago
    h.manual.advance(CURRENT_CHECK_EVERY_S / 2)
    h.flow.watch(h.now)
    assert len(h.asked(CheckCurrent)) == 1
    h.answer(NotCurrent([tasks[0]]))
    assert tasks[0].handle.cancelled and not tasks[1].handle.cancelled


def test_too_many_abandoned_steps_still_running_stop_the_worker_once() -> None:
    h = Harness(concurrency=1)
    h.running(2, timeout_ms=1_000)  # (the second waits in the runner for the slot)
    h.manual.advance(7.0)
    h.flow.watch(h.now)  # both past their deadline: 2 abandoned, the bound is 1
    h.flow.watch(h.now)
    assert h.stopped == 1


# -- results and wakeups ------------------------------------------------------------------------


def test_a_result_is_recorded_then_its_run_woken_and_the_task_done_once_acknowledged() -> None:
    h = Harness()
    (task,) = h.running(1)
    h.answer(Ended(task, AttemptResult(StepOutcome.SUCCEEDED, {"x": 1}), 0, 1_000_000))
    [(recorded, outcome)] = _recorded(h)
    assert recorded is task and outcome.outcome is StepOutcome.SUCCEEDED
    h.answer(Recorded([(task, True)]))
    assert [topic for topic, _v in h.broker.records] == [NAMES.wakeup("t1")]
    assert h.flow.holding() == 1 and h.done == []
    h.broker.ack()
    h.flow.take_answers(0.0)
    assert h.flow.holding() == 0 and h.done == [((TOPIC, 0), task.offset)]


def test_wakeups_unacknowledged_for_long_are_a_broker_outage() -> None:
    h = Harness()
    (task,) = h.running(1)
    h.answer(Ended(task, AttemptResult(StepOutcome.SUCCEEDED), 0, 1))
    _recorded(h)
    h.answer(Recorded([(task, True)]))
    h.manual.advance(5.0)
    h.flow.watch(h.now)
    assert not h.kafka.active
    h.manual.advance(0.5)
    h.flow.watch(h.now)
    assert h.kafka.active


def test_an_execution_over_after_it_was_abandoned_is_reported_ended() -> None:
    h = Harness()
    (task,) = h.running(1, timeout_ms=1_000)
    h.manual.advance(10.0)
    h.flow.watch(h.now)
    h.answer(
        Ended(task, AttemptResult(StepOutcome.SUCCEEDED), 0, 1)
    )  # its function returned at last
    h.answer(Over(task))
    h.flow.ask()
    reports = [r for req in h.asked(ReportExecutions) for r in req.reports]
    assert [(r.key, r.ended) for r in reports] == [(task.key, True)]


# -- back-pressure ------------------------------------------------------------------------------


def test_room_is_the_prefetch_and_the_slots_less_what_is_held() -> None:
    h = Harness(concurrency=2, prefetch=4)
    assert h.flow.room() == 6
    h.take(4)
    assert h.flow.room() == 2 and h.flow.in_flight() == (4, 0)
    h.take(2)
    assert h.flow.room() == 0
    h.flow.begin_stopping()
    assert h.flow.room() == 0 and h.flow.holding() == 0


def test_tasks_held_for_other_workers_stop_the_intake_and_are_claimed_again_later() -> None:
    h = Harness(concurrency=1, prefetch=64)
    h.take(HELD_PER_SLOT)
    held: list[Task] = []
    while len(held) < HELD_PER_SLOT:  # (claimed two at a time: the pace of one slot)
        h.flow.ask()
        (claim,) = h.asked(ClaimTasks)
        h.answer(Claimed([TaskClaim(t, ClaimVerdict.HELD, 1, None) for t in claim.tasks]))
        held += claim.tasks
    assert h.flow.held_by_state() == {"held": HELD_PER_SLOT}
    assert h.flow.room() == 0  # however much prefetch is left
    h.manual.advance(RECLAIM_AFTER_S - 0.01)
    h.flow.ask()
    assert h.asked(ClaimTasks) == []
    h.manual.advance(0.01)
    h.flow.ask()
    (again,) = h.asked(ClaimTasks)
    assert again.tasks == held[:2] and h.flow.room() > 0


def test_claims_go_ahead_of_the_slots_only_as_far_as_the_pace_says() -> None:
    h = Harness(concurrency=1, prefetch=64)
    h.take(10)
    h.flow.ask()
    (claim,) = h.asked(ClaimTasks)
    assert len(claim.tasks) == 2  # two slots' worth before any step ended
    assert [t.state for t in claim.tasks] == [State.CLAIMING] * 2


# -- the loop's times (turns.py) ----------------------------------------------------------------


def test_an_idle_loop_blocks_in_poll_and_a_busy_one_does_not() -> None:
    assert Turns.poll_wait(holding=0, backlog=0, in_flight=0) == IDLE_POLL_S
    for busy in ((1, 0, 0), (0, 1, 0), (0, 0, 1)):
        assert Turns.poll_wait(*busy) == 0.0
    assert Turns.answers_wait(polled=0, holding=3) == BUSY_WAIT_S
    assert Turns.answers_wait(polled=1, holding=3) == 0.0
    assert Turns.answers_wait(polled=0, holding=0) == 0.0


def test_records_on_their_way_go_at_once_only_when_nothing_else_is_to_do() -> None:
    """The cork: a loop with results on their way and nothing held or waiting sends them now;
    one with work goes on with it and leaves them to the linger's batch."""
    assert Turns.send_now(holding=0, backlog=0, in_flight=2)
    assert not Turns.send_now(holding=0, backlog=0, in_flight=0)
    assert not Turns.send_now(holding=1, backlog=0, in_flight=2)
    assert not Turns.send_now(holding=0, backlog=5, in_flight=2)


def test_the_watch_and_the_stats_line_come_at_their_intervals() -> None:
    manual = ManualClock()
    turns = Turns(manual.clock, stats_every_s=30.0)
    assert turns.watch_due(turns.now()) and not turns.watch_due(turns.now())
    manual.advance(WATCH_EVERY_S)
    assert turns.watch_due(turns.now())
    assert not turns.stats_due(turns.now())
    manual.advance(30.0)
    assert turns.stats_due(turns.now()) and not turns.stats_due(turns.now())


def test_a_stopping_worker_has_its_shutdown_bound_left_and_no_more() -> None:
    manual = ManualClock()
    turns = Turns(manual.clock, stats_every_s=30.0)
    assert turns.left_s() == 0.0  # not stopping: nothing to wait for
    turns.begin_stopping(turns.now(), wait_s=10.0)
    manual.advance(4.0)
    assert turns.left_s() == 6.0
    manual.advance(7.0)
    assert turns.left_s() == 0.0


# -- the lanes' requests ------------------------------------------------------------------------


def test_the_claims_lane_takes_its_requests_by_kind_with_the_highest_permit() -> None:
    h = Harness()
    h.take(3)
    a, b, c = (t for t in list(h.flow._book))
    report = Report(a.key, ended=True)
    permit, kinds = gather_claims(
        [
            ClaimTasks([a], permit=3),
            StorePermit(5),
            ClaimReruns([b]),
            Unclaim([c]),
            CheckCurrent([a]),
            ReportExecutions([report]),
            ClaimTasks([b], permit=2),
        ]
    )
    assert permit == 5
    assert kinds == {
        "claim": [a, b],
        "rerun": [b],
        "unclaim": [c],
        "check": [a],
        "report": [report],
    }
    assert gather_claims([StorePermit(4)]) == (4, {})
