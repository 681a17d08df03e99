"""The idle-latency phase of the benchmark: how long one run of the 4-step workflow takes when
nothing else is running, as a user's code sees it, and where that time goes.

One processor and one worker; runs started one at a time through the public client
(``start_run``, then ``wait_for_run``), the next once the previous one's end was seen. Each run
is timed twice: by the client (start called -> end seen) and inside the engine (the row's
creation -> its last transition). The breakdown per hop comes from timestamps the engine
writes anyway:

- ``dispatch``: the step task's record timestamp on the steps topic (set when the processor
  produced it, after its commit);
- ``claim``: ``eec_step_attempt.started_at``, when the worker claimed the attempt;
- ``recorded``: ``eec_step_result.recorded_at``, when the worker's result row was written;
- the run's ``created_at`` and ``last_transition_at``.

The hops of one run of s0 -> (s1, s2) -> s3:

- start -> first dispatch: the start wakeup, the first tick and its commit, the task's send;
- dispatch -> claim: the worker's fetch of the task, its claim statement (per step);
- claim -> recorded: the step's execution and its result's write (per step);
- recorded -> next dispatch: the result's wakeup, the tick, the send (s0 -> s1/s2, and the
  later of s1/s2 -> s3);
- parallel skew: the later of s1 and s2's dispatches minus the earlier;
- last recorded -> ended: the last tick;
- ended -> seen: the client's wait noticing the end.

Postgres's ``now()``, the producer's timestamps and the client's ``time.time()`` read the same
host clock here; on separate hosts the hops would carry their clocks' offsets.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition

from processor.client import start_run, wait_for_run
from processor.core.step_task import decode_step_task
from processor.io.config.settings import load_settings
from processor.io.kafka.configs import producer_config
from processor.io.kafka.logs import with_logger
from processor.tools.bench_floor import floor_lines
from processor.tools.bench_harness import Harness, fresh_database
from processor.tools.bench_support import stop
from processor.tools.latency_figures import STEPS, IdleLatency, RunTimes, report_idle, summarise
from processor.tools.waiting import polls


def measure_idle(
    bench: Harness, runs: int, warmup: int = 5, background_per_s: float = 0.0
) -> IdleLatency:
    """Start ``runs`` runs one at a time with a processor and a worker up; their times. With
    ``background_per_s``, other runs of the same workflow are started at that steady rate
    meanwhile (the latency of one run beside a light load)."""
    settings = bench.settings
    background = Background(bench, background_per_s) if background_per_s > 0 else None
    children = [
        bench.spawn(["process"], {}, "idle-process"),
        bench.spawn(["worker", "--concurrency", "8"], {}, "idle-worker"),
    ]
    workflow = bench.quad.name
    timed: dict[str, tuple[float, float]] = {}
    try:
        bench.wait_group(settings.group_id, 1, coordinator=True)
        bench.wait_group(settings.worker_group_id, 1, coordinator=False)
        if background is not None:
            background.start()
        for i, run_id in enumerate(bench.ids("idle", warmup + runs)):
            started = time.time() * 1000
            start_run(settings, workflow, run_id)
            wait_for_run(settings, run_id, timeout_s=60)
            if i >= warmup:
                timed[run_id] = (started, time.time() * 1000)
    finally:
        if background is not None:
            background.stop()
        for child in children:
            stop(child)
    dispatched = _dispatch_times(bench, set(timed))
    return summarise(list(_run_times(bench, timed, dispatched)), background_per_s)


class Background:
    """Runs of the 4-step workflow started at a steady rate on a thread of their own, from
    ``start`` to ``stop`` (inserted beforehand, as the end-to-end phase inserts its runs)."""

    SECONDS = 120  # runs inserted for this long at the rate; the phase takes far less

    def __init__(self, bench: Harness, per_s: float) -> None:
        self._bench, self._per_s = bench, per_s
        self._ids = bench.ids("load", int(per_s * self.SECONDS))
        bench.insert(bench.quad, self._ids)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-load", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        producer = Producer(with_logger(producer_config(self._bench.settings, "bench-load")))
        started = time.monotonic()
        for i, run_id in enumerate(self._ids):
            if self._stop.wait(max(0.0, started + i / self._per_s - time.monotonic())):
                break
            self._bench.produce_start(producer, run_id, duplicates=1, by_run=True)
        producer.flush(30)


def _dispatch_times(bench: Harness, run_ids: set[str]) -> dict[tuple[str, str], float]:
    """When each first attempt's task was produced: the steps topic's record timestamps."""
    topic = bench.names.steps
    consumer = Consumer(
        with_logger(
            {
                **bench.settings.kafka_common(),
                "group.id": f"bench-{bench.tag}-idle-read",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            }
        )
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([KafkaTopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        found: dict[tuple[str, str], float] = {}
        at_end: set[int] = set()
        for _ in polls(60, 0.0):  # no pause between polls: each waits up to 1 s for a record
            if len(at_end) >= len(partitions):
                break
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error() is not None:
                at_end.add(message.partition() or 0)  # end of partition (or an error: stop there)
                continue
            task = decode_step_task(message.value())
            if task.run_id in run_ids and task.attempt == 1:
                found[(task.run_id, task.node)] = float(message.timestamp()[1])
        return found
    finally:
        consumer.close()


def _run_times(
    bench: Harness,
    timed: Mapping[str, tuple[float, float]],
    dispatched: Mapping[tuple[str, str], float],
) -> Iterable[RunTimes]:
    ids = list(timed)
    epoch_ms = "extract(epoch FROM {}) * 1000"
    rows = bench.conn.execute(
        "SELECT run_id, "
        + ", ".join(epoch_ms.format(c) for c in ("created_at", "last_transition_at"))
        + " FROM eec_workflow_run WHERE run_id = ANY(%s)",
        (ids,),
    ).fetchall()
    claims = _per_step(bench, "eec_step_attempt", "started_at", ids)
    results = _per_step(bench, "eec_step_result", "recorded_at", ids)
    for run_id, created, ended in rows:
        started, seen = timed[run_id]
        yield RunTimes(
            started=started,
            seen=seen,
            created=float(created),
            ended=float(ended),
            dispatched={s: dispatched[(run_id, s)] for s in STEPS},
            claimed=claims[run_id],
            recorded=results[run_id],
        )


def _per_step(
    bench: Harness, table: str, column: str, ids: list[str]
) -> dict[str, dict[str, float]]:
    """``column`` of each run's first attempt of each step, in epoch ms."""
    rows = bench.conn.execute(
        f"SELECT run_id, node_id, extract(epoch FROM {column}) * 1000 FROM {table}"
        " WHERE run_id = ANY(%s) AND attempt = 1",
        (ids,),
    ).fetchall()
    found: dict[str, dict[str, float]] = {}
    for run_id, node, at in rows:
        found.setdefault(run_id, {})[node] = float(at)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """Only this phase (`python -m processor.tools.bench_latency [RUNS [RUNS_PER_S]]`: beside
    other runs started at that rate), on the bench's own fresh database: quicker than the
    whole benchmark while working on latency."""
    args = list(sys.argv[1:] if argv is None else argv)
    runs = int(args[0]) if args else 30
    per_s = float(args[1]) if len(args) > 1 else 0.0
    bench = Harness(fresh_database(load_settings()), 1.0)
    bench.setup()
    try:
        bench.phase("idle")
        figures = measure_idle(bench, runs, background_per_s=per_s)
        floor = floor_lines(bench.settings, tries=200)
    finally:
        bench.teardown()
    print("\n".join([*report_idle(figures), *floor]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
