"""Peak memory of one processor with a huge backlog and no database.

`python -m processor.tools.bench_memory [--wakeups N] [--seconds S]` produces N wakeups (one
million by default) onto fresh topics, then runs one `ductor process` whose Postgres is
unreachable (a port nothing listens on) for S seconds (60), sampling its resident memory
every second: backpressure must stop consumption at the backlog limit, so memory stays flat
however long the backlog. Prints the peak RSS and how many records the instance took.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from processor.core.envelope import Wakeup
from processor.core.routing import TopicNames, partition_for
from processor.io.config.settings import child_env, load_settings
from processor.io.kafka.clients import produce
from processor.io.kafka.configs import admin_config, producer_config
from processor.io.kafka.logs import with_logger
from processor.io.kafka.topics import create_topics, desired_topics
from processor.io.telemetry.logs import read_stats
from processor.tools.bench_support import stop
from processor.tools.child import popen_ductor
from processor.tools.waiting import polls

UNREACHABLE_DSN = "postgresql://ductor:ductor@127.0.0.1:1/ductor"


def _rss_bytes(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_memory", description=__doc__)
    parser.add_argument("--wakeups", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args(argv)
    tag = uuid.uuid4().hex[:6]
    settings = replace(
        load_settings(),
        topic_prefix=f"bench-memory-{tag}",
        group_id=f"bench-memory-{tag}",
        stats_log_interval_s=1.0,
    )
    create_topics(settings)
    names = TopicNames(settings.topic_prefix)
    topic = names.wakeup("t1")
    log = Path(f"/tmp/ductor-bench-memory-{tag}.log")
    try:
        print(f"producing {args.wakeups} wakeups ...", flush=True)
        producer = Producer(with_logger(producer_config(settings, "bench-memory")))
        now_ms = int(time.time() * 1000)
        for i in range(args.wakeups):
            wakeup = Wakeup(f"m{tag}-{i}", "start", produced_at=now_ms)
            partition = partition_for(wakeup.run_id, settings.wakeup_partitions)
            produce(producer, topic, wakeup.encode(), wakeup.key(), partition)
            if i % 10_000 == 0:
                producer.poll(0)
        producer.flush(120)
        env = child_env(replace(settings, pg_dsn=UNREACHABLE_DSN))
        print(f"one instance, Postgres unreachable, for {args.seconds:.0f} s ...", flush=True)
        child = popen_ductor(["process"], env, log)
        peak = 0
        for _ in polls(args.seconds, 1.0):  # the sampling period of a measurement
            if child.poll() is not None:
                break
            peak = max(peak, _rss_bytes(child.pid, "VmRSS"))
        high_water = _rss_bytes(child.pid, "VmHWM") if child.poll() is None else peak
        stop(child)
        stats = read_stats(log) or {}
        print(
            f"peak RSS {max(peak, high_water) / 2**20:.0f} MiB with {args.wakeups} wakeups"
            f" waiting and Postgres unreachable for {args.seconds:.0f} s;"
            f" records taken: {stats.get('records', '?')} (the rest stayed in Kafka)"
        )
    finally:
        admin = AdminClient(with_logger(admin_config(settings, "bench-memory")))
        for future in admin.delete_topics(list(desired_topics(settings))).values():
            future.result(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
