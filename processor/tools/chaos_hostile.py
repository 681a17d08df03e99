"""The chaos run's hostile producer: what a careless or hostile writer of ``ductor.requests``
sends while the fleet is killed and its services go away (its records are
chaos_hostile_kinds.py's; the checks that nothing it sent did more than one dead letter each
are chaos_hostile_check.py's).

The processors of the run read the requests topic under a scope (``DUCTOR_REQUESTS_*``,
core/scopes.py) that the run's own traffic on it fits: starts of the map workflow under the
run's prefixes, and the ``approved`` signal that its wait step waits for. That own traffic is
one run of a map over ``map_items`` items of its input (10,000: the most a map may have),
started and approved through the topic, beside the ordinary runs.

The hostile records come in turn from ``KINDS``, spread over the run like its starts, each
with the dead-letter reason it must get: documents nested 300 levels (starts and signals)
and other JSON no door may store, starts of run ids only Ductor gives (a schedule's
``NAME@TIME``, a child's ``PARENT/STEP#1`` of a live chaos run) or of a chaos run's own id
(colliding), and forged signals: a cancel of a chaos run or of the map run, an approval of a
run outside the scope's prefixes, and an approval the scope lets through to a run that waits
for none (core/landing.py). Each carries a header (``chaos.hostile``) naming it, which its
dead letter keeps, so the check reads the dead letters by source position (copies sent again
after a kill folded: io/kafka/dlq.py) and finds each record refused once, with its reason.

A record whose delivery failed is written again as a new one (the failed one may still have
reached the topic: it may then have one dead letter, or none).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from confluent_kafka import KafkaError, Producer

from processor.core.requests import SignalRequest, StartRequest
from processor.core.routing import TopicNames, partition_for
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import MAP_ITEMS_LIMIT, WorkflowDef
from processor.io.config.settings import Settings
from processor.io.kafka.clients import produce, topic_partitions
from processor.io.kafka.configs import producer_config
from processor.io.kafka.logs import with_logger
from processor.tools.chaos_hostile_kinds import APPROVAL, KINDS, MAP_WORKFLOW, Kind, Target

log = logging.getLogger("ductor.chaos")

HEADER = "chaos.hostile"  # names a hostile record: "<n> <kind>"
OWN_HEADER = "chaos.own"  # the run's own traffic on the topic
_BATCH_EVERY_S = 0.5


# The map run's items in flight: a few per worker slot (the run's 2 workers of 4 slots), so
# that a slot never waits for the coordinator, without a queue that outlasts a step's deadline.
MAP_PARALLELISM = 32


@dataclass(frozen=True)
class HostilePlan:
    records: int = 850  # hostile records, the kinds in turn
    map_items: int = 10_000  # items of the map run (0: no map run), at most MAP_ITEMS_LIMIT
    map_at: float = 0.15  # when the map run is started, as a share of the run's duration


def map_workflow(step_timeout_s: float) -> WorkflowDef:
    """A map of the sample ``fast`` step over the run's input (as many items as a map may
    have: the short run and the long one register the same definition), then a wait for its
    approval (which comes through the requests topic, early: it counts when the wait is
    reached)."""
    return parse_workflow(
        {
            "name": MAP_WORKFLOW,
            "version": 1,
            "steps": [
                {
                    "name": "items",
                    "kind": "map",
                    "type": "fast",
                    "max_items": MAP_ITEMS_LIMIT,
                    "parallelism": MAP_PARALLELISM,
                    "timeout_ms": int(step_timeout_s * 1000),
                    "retry": {"max_attempts": 3, "backoff_ms": 100},
                },
                {"name": "release", "kind": "wait", "signal": APPROVAL, "depends_on": ["items"]},
            ],
            "output": "items",
        }
    )


def map_run_id(topic_prefix: str) -> str:
    """Outside the ordinary runs' prefix (``<topic prefix>-``), whose checks it would join."""
    return f"{topic_prefix}.map"


def scoped(settings: Settings, topic_prefix: str) -> Settings:
    """The processors' settings with the requests topic's scope: the run's own traffic fits
    it, the forged records do not."""
    return replace(
        settings,
        requests_workflows=(MAP_WORKFLOW,),
        requests_run_id_prefixes=(f"{topic_prefix}-", map_run_id(topic_prefix)),
        requests_signals=(APPROVAL,),
    )


class HostileProducer:
    """Writes the run's own traffic and the hostile records on a thread of its own over
    ``over_s`` seconds, riding through the broker's outages; ``started()`` says how many of
    ``run_ids`` exist so far (a record names only a chaos run that exists)."""

    def __init__(
        self,
        settings: Settings,
        plan: HostilePlan,
        run_ids: Sequence[str],
        started: Callable[[], int],
        over_s: float,
        map_after_s: float,
        rng: random.Random,
    ) -> None:
        self._settings = settings
        self.plan = plan
        self._run_ids = list(run_ids)
        self._started = started
        self._over_s = over_s
        self._map_after_s = map_after_s
        self._rng = rng
        self.topic_prefix = settings.topic_prefix
        self.topic = TopicNames(settings.topic_prefix).requests
        self.map_id = map_run_id(settings.topic_prefix)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.sent: dict[str, Kind] = {}  # hostile id: its kind
        self.acknowledged: dict[str, Kind] = {}
        self.failed: dict[str, Kind] = {}  # delivery failed: written again as a new record
        self.own_acknowledged = 0
        self.own_failed = 0
        self.error: BaseException | None = None
        # Records whose delivery failed, to write again: (key, value, kind; None: our own).
        self._again: list[tuple[str, bytes, Kind | None]] = []
        self._thread = threading.Thread(target=self._run, name="chaos-hostile", daemon=True)

    @property
    def own_expected(self) -> int:
        return 2 if self.plan.map_items else 0  # the map run's start and its approval

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float) -> bool:
        """Wait until every record is acknowledged (or failed and written again); False if
        not."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive() and self.error is None

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        try:
            config = {**producer_config(self._settings, "ductor-chaos-hostile"), "log_level": 0}
            producer = Producer(with_logger(config))
            partitions = topic_partitions(producer, [self.topic])[self.topic]
            began = time.monotonic()
            map_due = self.plan.map_items > 0
            batches = max(1, round(self._over_s / _BATCH_EVERY_S))
            size = -(-self.plan.records // batches)
            n = turn = 0
            while n < self.plan.records or map_due:
                if self._stop.wait(max(0.0, began + turn * _BATCH_EVERY_S - time.monotonic())):
                    return
                turn += 1
                if map_due and time.monotonic() - began >= self._map_after_s:
                    self._own_traffic(producer, partitions)
                    map_due = False
                live = self._started()
                for _ in range(min(size, self.plan.records - n) if live else 0):
                    kind = KINDS[n % len(KINDS)]
                    chosen = self._run_ids[self._rng.randrange(live)]
                    target = Target(n, chosen, self._settings.topic_prefix, self.map_id)
                    key, value = kind.build(target)
                    self._send(producer, partitions, key, value, kind)
                    n += 1
                self._send_again(producer, partitions)
            while not self._stop.is_set() and not self._all_answered():
                producer.poll(0.1)
                self._send_again(producer, partitions)
        except BaseException as exc:  # reported by the run, which then fails
            self.error = exc
            log.exception("the chaos run's hostile producer failed")

    def _own_traffic(self, producer: Producer, partitions: int) -> None:
        """The map run's start (its items as its input) and its approval, in that order on
        the map run's partition."""
        items = list(range(self.plan.map_items))
        start = StartRequest(self.map_id, MAP_WORKFLOW, input=items).encode()
        approval = SignalRequest(self.map_id, APPROVAL, f"{self.map_id}:approval", {"by": "chaos"})
        for value in (start, approval.encode()):
            self._send(producer, partitions, self.map_id, value, None)

    def _send(
        self, producer: Producer, partitions: int, key: str, value: bytes, kind: Kind | None
    ) -> None:
        """One record; ``kind`` None: the run's own (written again as it was if its delivery
        fails: a start and a signal are idempotent by their ids)."""
        if kind is None:
            headers = [(OWN_HEADER, b"map")]
        else:
            with self._lock:
                hostile_id = f"{len(self.sent)} {kind.name}"
                self.sent[hostile_id] = kind
            headers = [(HEADER, hostile_id.encode())]

        def delivered(err: KafkaError | None, _msg: Any) -> None:
            with self._lock:
                if kind is None:
                    self.own_acknowledged += err is None
                    self.own_failed += err is not None
                elif err is None:
                    self.acknowledged[hostile_id] = kind
                else:
                    self.failed[hostile_id] = kind
                if err is not None:
                    self._again.append((key, value, kind))

        partition = partition_for(key, partitions)
        produce(producer, self.topic, value, key.encode(), partition, headers, delivered)

    def _send_again(self, producer: Producer, partitions: int) -> None:
        producer.poll(0)
        with self._lock:
            again, self._again = self._again, []
        for key, value, kind in again:
            self._send(producer, partitions, key, value, kind)

    def _all_answered(self) -> bool:
        with self._lock:
            hostile = len(self.acknowledged) + len(self.failed) == len(self.sent)
            return hostile and not self._again and self.own_acknowledged >= self.own_expected
