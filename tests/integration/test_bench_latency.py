"""The benchmark's idle-latency phase on the real services (processor/tools/bench_latency.py):
runs started one at a time through the client end, and every hop of the breakdown is found
in what the engine recorded."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from processor.io.config.settings import Settings
from processor.tools.bench_floor import floor_lines
from processor.tools.bench_harness import Harness, fresh_database
from processor.tools.bench_latency import measure_idle
from processor.tools.databases import drop_database
from processor.tools.latency_figures import HOPS, report_idle

pytestmark = pytest.mark.integration


def test_the_idle_phase_times_each_hop_of_runs_started_one_at_a_time(
    base_settings: Settings,
) -> None:
    settings = fresh_database(base_settings)
    bench = Harness(settings, 1.0)
    try:
        bench.setup()
        bench.phase("idle")
        figures = measure_idle(bench, runs=3, warmup=1)
        floor = floor_lines(bench.settings, tries=5)
        bench.phase("loaded")
        loaded = measure_idle(bench, runs=2, warmup=0, background_per_s=20)
        started_beside = bench.conn.execute(
            "SELECT count(*) FROM eec_workflow_run WHERE run_id LIKE %s AND status <> 'pending'",
            (f"b{bench.tag}-load-%",),
        ).fetchone()
    finally:
        bench.teardown()
        with psycopg.connect(base_settings.pg_dsn, autocommit=True) as admin:
            drop_database(admin, str(conninfo_to_dict(settings.pg_dsn)["dbname"]))
    assert figures.runs == 3
    assert list(figures.hops) == list(HOPS)
    # Each hop is a span between two recorded moments in order (the same host clock; Kafka's
    # timestamps are whole milliseconds, so one may read up to 1 ms early).
    for hop, p in figures.hops.items():
        assert p.p50 >= -1, hop
    assert 0 < figures.engine.p50 <= figures.client.p50
    lines = report_idle(figures)
    assert lines[0].startswith("idle latency, 4-step workflow, 3 runs")
    assert len(lines) == 4 + len(HOPS)
    # Beside a load: other runs were started while the two were timed.
    assert loaded.runs == 2 and loaded.background_per_s == 20
    assert report_idle(loaded)[0].startswith("latency beside 20 runs/s")
    assert started_beside is not None and started_beside[0] > 0
    # The floor: a Kafka round trip each way of fetching, a Postgres commit each way.
    assert len(floor) == 5 and floor[0].startswith("the floor of one hop, 5 tries")
    for line in floor[1:]:
        p50, p99 = (float(x) for x in line.split()[-2:])
        assert 0 < p50 <= p99, line
