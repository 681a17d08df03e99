"""Map steps beside ordinary runs: what one item's result costs the coordinator, and what a
big map does to the runs around it.

    python -m processor.tools.bench_maps --items 1000 10000 --ordinary 300

On a database created empty for it (``<database>_bench``), one processor and one worker (8
slots, the sample registry's no-op ``fast`` step). First the ordinary runs alone (the 4-step
workflow, woken at a steady pace): their latency (woken to ended) and the processor's CPU per
run, the baseline. Then, for each map size, one run mapping ``fast`` over a list of that many
items (its input), the same ordinary runs woken at the same pace once a tenth of its items
are done; per item result: the processor's CPU, its own Postgres backends' (its sessions,
found by their client ports) and all of Postgres's (the workers' too: each item's worker reads
its list whole), the ordinary runs' share as measured alone taken off the first two; the bytes
of the rows the coordinator wrote
(the run row as stored, its state as JSON, the outbox's records, the map's item rows: a
trigger sums them), and the ordinary runs' latency against the baseline's.

It prints the figures and asserts nothing about speed. Needs the local services up.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from processor.client import wake
from processor.core.workflow import parse_workflow
from processor.io.config.settings import load_settings
from processor.io.postgres.runs_admin import insert_runs
from processor.io.postgres.workflows import register_workflow
from processor.tools.bench_cpu import CpuUse, read_stat
from processor.tools.bench_harness import fresh_database
from processor.tools.bench_phases import Bench
from processor.tools.bench_support import stop
from processor.tools.waiting import polls

MAP_WORKFLOW = "bench-map"

# What each write of the coordinator puts in the rows it writes, summed per table by a
# trigger: the run row (``node_states`` as stored, compressed or not, and as JSON text), the
# outbox's records, a map's item rows (where the table exists).
_METER_SQL = """
CREATE TABLE IF NOT EXISTS bench_writes (
    tbl text, run_id text, stored bigint, json bigint);
CREATE OR REPLACE FUNCTION bench_writes_fn() RETURNS trigger AS $$
BEGIN
  IF TG_TABLE_NAME = 'eec_workflow_run' THEN
    INSERT INTO bench_writes VALUES (TG_TABLE_NAME, NEW.run_id,
        pg_column_size(NEW.node_states), octet_length(NEW.node_states::text));
  ELSIF TG_TABLE_NAME = 'eec_outbox' THEN
    INSERT INTO bench_writes VALUES (TG_TABLE_NAME, NEW.run_id,
        pg_column_size(NEW.records), octet_length(NEW.records::text));
  ELSE
    INSERT INTO bench_writes VALUES (TG_TABLE_NAME, NEW.run_id,
        pg_column_size(NEW.*), pg_column_size(NEW.*));
  END IF;
  RETURN NULL;
END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS bench_writes_run ON eec_workflow_run;
CREATE TRIGGER bench_writes_run AFTER UPDATE ON eec_workflow_run
    FOR EACH ROW EXECUTE FUNCTION bench_writes_fn();
DROP TRIGGER IF EXISTS bench_writes_outbox ON eec_outbox;
CREATE TRIGGER bench_writes_outbox AFTER INSERT ON eec_outbox
    FOR EACH ROW EXECUTE FUNCTION bench_writes_fn();
"""
_ITEM_METER_SQL = """
DROP TRIGGER IF EXISTS bench_writes_items ON eec_map_item;
CREATE TRIGGER bench_writes_items AFTER INSERT ON eec_map_item
    FOR EACH ROW EXECUTE FUNCTION bench_writes_fn();
"""


@dataclass(frozen=True)
class Latency:
    """The ordinary runs' latency, woken to ended (ms)."""

    p50: float
    p99: float
    runs: int


@dataclass(frozen=True)
class MapFigures:
    items: int
    seconds: float  # the map run, woken to ended
    commits: int  # its transitions
    cpu: CpuUse
    backends_s: float  # the CPU of the processor's own Postgres sessions
    written: dict[str, tuple[int, int, int]]  # table -> (rows, bytes stored, bytes as JSON)
    beside: Latency


class MapBench:
    def __init__(self, bench: Bench, parallelism: int, pace_s: float) -> None:
        self.bench = bench
        self.conn = bench.conn
        self.parallelism = parallelism
        self.pace_s = pace_s

    def setup(self) -> None:
        self.bench.setup()
        register_workflow(
            self.conn,
            parse_workflow(
                {
                    "name": MAP_WORKFLOW,
                    "version": 1,
                    "steps": [
                        {
                            "name": "m",
                            "kind": "map",
                            "type": "fast",
                            "max_items": 10_000,
                            "parallelism": self.parallelism,
                            "timeout_ms": 120_000,
                        }
                    ],
                }
            ),
        )
        self.conn.execute(_METER_SQL)
        if self.conn.execute("SELECT to_regclass('eec_map_item')").fetchone() != (None,):
            self.conn.execute(_ITEM_METER_SQL)

    def baseline(self, ordinary: int) -> tuple[Latency, CpuUse, float]:
        """The ordinary runs alone: their latency, the CPU they cost and that of the
        processor's Postgres sessions."""
        bench = self.bench
        bench.phase("maps-base")
        ids = bench.ids("base", ordinary)
        bench.insert(bench.quad, ids)
        children = self._spawn("base")
        try:
            self._warm("base")
            meter = bench.meter([children[0].pid], [children[1].pid])
            sessions = self._sessions(children[0].pid)
            meter.start()
            woken = self._pace(ids)
            bench.wait_terminal(ids, timeout=600)
            cpu = meter.stop()
            backends_s = self._sessions_s(children[0].pid, sessions)
        finally:
            for child in children:
                stop(child)
        return self._latency(woken), cpu, backends_s

    def beside(self, items: int, ordinary: int) -> MapFigures:
        """One map of ``items`` items, the ordinary runs woken while it goes."""
        bench = self.bench
        bench.phase(f"maps-{items}")
        (map_id,) = bench.ids(f"map{items}", 1)
        ids = bench.ids(f"beside{items}", ordinary)
        bench.insert(bench.quad, ids)
        wf = bench.conn.execute(
            "SELECT definition FROM eec_workflow_definition WHERE name = %s", (MAP_WORKFLOW,)
        ).fetchone()
        assert wf is not None
        insert_runs(self.conn, parse_workflow(wf[0]), [(map_id, list(range(items)))], "t1")
        # Started by its wakeup below, not by the overdue sweep (as Bench.insert does).
        self.conn.execute(
            "UPDATE eec_workflow_run SET next_wakeup_at = NULL WHERE run_id = %s", (map_id,)
        )
        self.conn.execute("TRUNCATE bench_writes")
        children = self._spawn(f"map{items}")
        try:
            self._warm(f"map{items}")
            meter = bench.meter([children[0].pid], [children[1].pid])
            sessions = self._sessions(children[0].pid)
            meter.start()
            started = self._db_ms()
            wake(bench.settings, [map_id], "t1", "start")
            self._wait_results(map_id, items // 10, timeout=3600)
            woken = self._pace(ids)
            bench.wait_terminal([*ids, map_id], timeout=3600)
            cpu = meter.stop()
            backends_s = self._sessions_s(children[0].pid, sessions)
        finally:
            for child in children:
                stop(child)
        row = self.conn.execute(
            "SELECT status, last_transition_seq,"
            " (extract(epoch FROM updated_at) * 1000)::bigint FROM eec_workflow_run"
            " WHERE run_id = %s",
            (map_id,),
        ).fetchone()
        assert row is not None
        status, commits, ended_ms = row
        if status != "succeeded":
            raise RuntimeError(f"the map run ended {status}")
        written = {
            tbl: (int(n), int(stored), int(json))
            for tbl, n, stored, json in self.conn.execute(
                "SELECT tbl, count(*), sum(stored), sum(json) FROM bench_writes"
                " WHERE run_id = %s GROUP BY tbl",
                (map_id,),
            ).fetchall()
        }
        return MapFigures(
            items,
            (ended_ms - started) / 1000,
            commits,
            cpu,
            backends_s,
            written,
            self._latency(woken),
        )

    # -- plumbing ------------------------------------------------------------------------------

    def _spawn(self, label: str) -> list[Any]:
        bench = self.bench
        return [
            bench.spawn(["process"], {}, f"{label}-process"),
            bench.spawn(["worker", "--concurrency", "8"], {}, f"{label}-worker"),
        ]

    def _warm(self, label: str) -> None:
        """Both groups joined and the whole path warm: a few ordinary runs end first."""
        bench = self.bench
        bench.wait_group(bench.settings.group_id, 1, coordinator=True)
        bench.wait_group(bench.settings.worker_group_id, 1, coordinator=False)
        warmup = bench.ids(f"{label}-warmup", 10)
        bench.insert(bench.quad, warmup)
        wake(bench.settings, warmup, "t1", "start")
        bench.wait_terminal(warmup, timeout=120)

    def _pace(self, ids: Sequence[str], chunk: int = 10) -> dict[str, int]:
        """Wake ``ids`` a chunk at a time, evenly over the pace: each run's wake time (ms,
        Postgres's clock)."""
        woken: dict[str, int] = {}
        chunks = [ids[i : i + chunk] for i in range(0, len(ids), chunk)]
        started = time.monotonic()
        for n, part in enumerate(chunks):
            delay = started + self.pace_s * n / len(chunks) - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # the benchmark paces its load; this is not a test
            at = self._db_ms()
            wake(self.bench.settings, part, "t1", "start")
            woken.update(dict.fromkeys(part, at))
        return woken

    def _latency(self, woken: dict[str, int]) -> Latency:
        rows = self.conn.execute(
            "SELECT run_id, (extract(epoch FROM updated_at) * 1000)::bigint"
            " FROM eec_workflow_run WHERE run_id = ANY(%s)",
            (list(woken),),
        ).fetchall()
        took = sorted(ended - woken[run_id] for run_id, ended in rows)
        p99 = took[min(len(took) - 1, int(len(took) * 0.99))]
        return Latency(statistics.median(took), p99, len(took))

    def _wait_results(self, run_id: str, count: int, timeout: float) -> None:
        for _ in polls(timeout, 0.2):
            row = self.conn.execute(
                "SELECT count(*) FROM eec_step_result WHERE run_id = %s", (run_id,)
            ).fetchone()
            if row is not None and row[0] >= count:
                return
        raise RuntimeError(f"{run_id}: fewer than {count} item results in {timeout} s")

    def _sessions(self, pid: int) -> dict[int, int]:
        """The Postgres backends serving process ``pid`` (matched by its sockets' ports), with
        the CPU each has used (clock ticks)."""
        inodes = set()
        with contextlib.suppress(OSError):
            for fd in os.scandir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    inodes.add(os.readlink(fd.path))
        ports = set()
        for table in ("tcp", "tcp6"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/net/{table}") as lines:
                for line in list(lines)[1:]:
                    cols = line.split()
                    if f"socket:[{cols[9]}]" in inodes:
                        ports.add(int(cols[1].rsplit(":", 1)[1], 16))
        backends = self.conn.execute(
            "SELECT pid, client_port FROM pg_stat_activity WHERE datname = current_database()"
        ).fetchall()
        return {
            backend: stat.own
            for backend, port in backends
            if port in ports and (stat := read_stat(backend)) is not None
        }

    def _sessions_s(self, pid: int, before: dict[int, int]) -> float:
        """The CPU seconds the backends serving ``pid`` used since ``before``."""
        now = self._sessions(pid)
        ticks = sum(used - before.get(backend, 0) for backend, used in now.items())
        return ticks / os.sysconf("SC_CLK_TCK")

    def _db_ms(self) -> int:
        row = self.conn.execute("SELECT (extract(epoch FROM now()) * 1000)::bigint").fetchone()
        assert row is not None
        return int(row[0])


def report(
    base: Latency,
    base_cpu: CpuUse,
    base_backends_s: float,
    ordinary: int,
    maps: Sequence[MapFigures],
) -> str:
    """The figures as a table, one row per map size."""
    ticks_per_run = 5  # the 4-step workflow: its start, then one per result
    per_run = {g: (s or 0.0) / ordinary for g, s in base_cpu.seconds.items()}
    lines = [
        f"ordinary runs alone ({ordinary}): latency p50 {base.p50:.0f} ms, p99 {base.p99:.0f}"
        f" ms; processor CPU {per_run['instance'] / ticks_per_run * 1e3:.2f} ms per tick",
        "",
        "items  map s  items/s  commits  proc ms/result  its pg ms/result  all pg ms/result"
        "  run row B/result  (state JSON B)  all rows B/result  beside p50/p99 ms  vs alone",
    ]
    for m in maps:
        instance = (m.cpu.seconds.get("instance") or 0.0) - per_run["instance"] * ordinary
        sessions = m.backends_s - base_backends_s
        postgres = m.cpu.seconds.get("postgres") or 0.0
        run_rows = m.written.get("eec_workflow_run", (0, 0, 0))
        stored = sum(w[1] for w in m.written.values())
        lines.append(
            f"{m.items:>5}  {m.seconds:>5.0f}  {m.items / m.seconds:>7.0f}  {m.commits:>7}"
            f"  {instance / m.items * 1e3:>14.2f}  {sessions / m.items * 1e3:>16.2f}"
            f"  {postgres / m.items * 1e3:>16.2f}"
            f"  {run_rows[1] / m.items:>16,.0f}  {run_rows[2] / m.items:>15,.0f}"
            f"  {stored / m.items:>17,.0f}  {m.beside.p50:>7.0f}/{m.beside.p99:<8.0f}"
            f"  {m.beside.p50 / base.p50:.1f} x / {m.beside.p99 / base.p99:.1f} x"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m processor.tools.bench_maps")
    parser.add_argument("--items", type=int, nargs="+", default=[1000, 10_000])
    parser.add_argument("--ordinary", type=int, default=300, help="ordinary runs beside a map")
    parser.add_argument("--parallelism", type=int, default=10, help="the map's parallelism")
    parser.add_argument("--pace", type=float, default=15.0, help="seconds to wake them over")
    parser.add_argument("--json", action="store_true", help="the figures as JSON too")
    args = parser.parse_args(argv)
    bench = Bench(fresh_database(load_settings()), 1.0)
    maps = MapBench(bench, args.parallelism, args.pace)
    maps.setup()
    try:
        base, base_cpu, base_backends_s = maps.baseline(args.ordinary)
        figures = [maps.beside(items, args.ordinary) for items in args.items]
    finally:
        bench.teardown()
    print(report(base, base_cpu, base_backends_s, args.ordinary, figures))
    if args.json:
        print(
            orjson.dumps(
                {
                    "baseline": base.__dict__,
                    "maps": [
                        {
                            "items": m.items,
                            "seconds": m.seconds,
                            "commits": m.commits,
                            "cpu_s": m.cpu.seconds,
                            "processor_sessions_s": m.backends_s,
                            "written": m.written,
                            "beside": m.beside.__dict__,
                        }
                        for m in figures
                    ],
                }
            ).decode()
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
