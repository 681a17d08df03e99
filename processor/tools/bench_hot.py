"""Micro-benchmark of the instance's hot paths, without Kafka or Postgres: the pure tick of a
batch (a run's first tick, and a tick on a step result), decoding a loaded batch (the load's
JSON document into ``LoadedRun`` objects, checksums verified), encoding a batch's commit
parameters, the intake verdict of a consumed wakeup, and the loop thread's share of a run's
tick (its record taken in, its committed plan carried out: two step tasks handed to a real
producer client with no broker behind it, so no delivery report). Figures are µs of the
thread's CPU per run (or record), the minimum of ``--repeat`` timings of ``--number`` calls on
a batch of ``--batch`` runs of the 4-step workflow the end-to-end bench runs (s0; s1 and s2
after it; s3 after both).

``--compare`` runs the measurement in child processes, alternating the pure-Python build
(``DUCTOR_PURE_PYTHON=1``) and the compiled one, and prints both side by side (the compiled
column is the pure one again where no compiled module is installed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import timeit
from collections.abc import Callable
from typing import Any

import orjson
from confluent_kafka import Producer
from opentelemetry.trace import Span

from processor.build import compiled_modules
from processor.core.decide import decide, tick_batch
from processor.core.envelope import Wakeup
from processor.core.intake import Accepted, admit
from processor.core.model import Loaded, LoadedRun
from processor.core.offsets import OffsetTracker
from processor.core.outcomes import Outcome
from processor.core.pending import RunBook
from processor.core.plans import BatchItem, Plan, Rules
from processor.core.records import MessageError
from processor.core.routing import TopicNames
from processor.core.run_state import NodeStatus, row_checksum
from processor.core.stats import Stats
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import WorkflowDef
from processor.engine.assembly import build_executor, commons
from processor.engine.database import Database
from processor.io.kafka.clients import Publisher
from processor.io.kafka.logs import with_logger
from processor.io.postgres import store
from processor.io.runtime.clock import Clock
from processor.io.telemetry.setup import Telemetry

NAMES = TopicNames("ductor")
NOW_MS = 1_700_000_000_000
WF = parse_workflow(
    {
        "name": "bench-quad",
        "version": 1,
        "steps": [
            {"name": "s0", "type": "fast", "timeout_ms": 30000},
            {"name": "s1", "type": "fast", "depends_on": ["s0"], "timeout_ms": 30000},
            {"name": "s2", "type": "fast", "depends_on": ["s0"], "timeout_ms": 30000},
            {"name": "s3", "type": "fast", "depends_on": ["s1", "s2"], "timeout_ms": 30000},
        ],
    }
)
PHASES = ("tick_first", "tick_result", "decode", "encode", "intake", "carry_out")


def _row(run_id: str, first: bool) -> list[Any]:
    """A run's row as the load statement returns it (io/postgres/store.py ``_LOAD_SQL``): pending
    with its input (``first``), or running with s0's result in."""
    if first:
        status, nodes, seq = "pending", {}, 0
        results, raw_input, not_before = None, [{"order": run_id, "amount": 12}], NOW_MS - 5
    else:
        status, seq = "running", 1
        nodes = {
            "s0": {"status": "dispatched", "attempt": 1, "due_ms": NOW_MS + 30000},
            "s1": {"status": "pending", "attempt": 0},
            "s2": {"status": "pending", "attempt": 0},
            "s3": {"status": "pending", "attempt": 0},
        }
        results, raw_input, not_before = [["s0", 1, "succeeded", None, True, None]], None, None
    checksum = row_checksum(status, nodes, seq, None)
    return [
        run_id, WF.name, WF.version, status, nodes, seq, checksum, 3, None, "t1",
        results, None, raw_input, not_before, None, None, None,
    ]  # fmt: skip


class _Cursor:
    def __init__(self, row: tuple[str, int]) -> None:
        self._row = row

    def fetchone(self) -> tuple[str, int]:
        return self._row


class _Connection:
    """What ``load_runs_at`` reads of a connection: one statement's one row."""

    def __init__(self, document: str) -> None:
        self._cursor = _Cursor((document, NOW_MS))

    def execute(self, _sql: str, _params: object) -> _Cursor:
        return self._cursor


class _Message:
    def __init__(self, value: bytes, offset: int) -> None:
        self._value, self._offset = value, offset

    def topic(self) -> str | None:
        return "ductor.wakeup.t1"

    def partition(self) -> int | None:
        return 0

    def offset(self) -> int | None:
        return self._offset

    def key(self) -> bytes | None:
        return b"k"

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, str | bytes | None]] | None:
        return [("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")]

    def error(self) -> MessageError | None:
        return None


def _definitions(wf: WorkflowDef) -> store.Definitions:
    definitions = store.Definitions()
    definitions._cache[wf.key] = wf
    return definitions


def _load(batch: int, first: bool) -> tuple[_Connection, dict[str, Loaded]]:
    rows = [_row(f"run-{i:06d}", first) for i in range(batch)]
    conn = _Connection(orjson.dumps(rows).decode())
    loaded, _ = store.load_runs_at(conn, _definitions(WF), [r[0] for r in rows])  # type: ignore[arg-type]
    assert all(isinstance(r, LoadedRun) and r.checksum_ok for r in loaded.values())
    return conn, loaded


def phases(batch: int) -> dict[str, tuple[Callable[[], object], int]]:
    """Each phase's call, and how many runs (or records) one call handles."""
    _, pending = _load(batch, first=True)
    conn, running = _load(batch, first=False)
    definitions = _definitions(WF)
    ids = list(running)
    commits = list(tick_batch(running, NOW_MS, NAMES).values())
    assert len(commits) == batch
    assert all(c.state.node("s1").status is NodeStatus.DISPATCHED for c in commits)
    assert len(tick_batch(pending, NOW_MS, NAMES)) == batch
    acked = [(f"run-{i:06d}", 1) for i in range(batch)]
    messages = [
        _Message(Wakeup(f"run-{i:06d}", "step_result", produced_at=NOW_MS).encode(), i)
        for i in range(batch)
    ]
    assert all(isinstance(admit(m, NAMES, 1 << 20, NOW_MS), Accepted) for m in messages)

    def intake() -> None:
        for message in messages:
            admit(message, NAMES, 1 << 20, NOW_MS)

    carry_out = _carry_out(running, messages)
    return {
        "tick_first": (lambda: tick_batch(pending, NOW_MS, NAMES), batch),
        "tick_result": (lambda: tick_batch(running, NOW_MS, NAMES), batch),
        "decode": (lambda: store.load_runs_at(conn, definitions, ids), batch),  # type: ignore[arg-type]
        "encode": (lambda: store.commit_params(commits, acked, "instance-1"), batch),
        "intake": (intake, batch),
        "carry_out": (carry_out, batch),
    }


def _carry_out(running: dict[str, Loaded], messages: list[_Message]) -> Callable[[], None]:
    """The loop thread's part of a batch: each run's record taken in (intake verdict, offset
    tracked, joined to its run's work), then taken for a batch and its committed plan carried
    out (two step tasks produced). The producer's queue is emptied after each call."""
    producer = Producer(with_logger({"bootstrap.servers": "127.0.0.1:1", "log_level": 0}))
    tracker, stats = OffsetTracker(), Stats()
    partitions = dict.fromkeys([*NAMES.coordinator_topics(), NAMES.steps, NAMES.dlq], 3)
    rules = Rules(NAMES, livelock_requeues=3)
    book: RunBook[Span] = RunBook()
    clock = Clock(lambda: 100.0, lambda: NOW_MS)
    shared = commons(
        Publisher(producer), partitions, NAMES, stats, Telemetry(), clock, None, tracker
    )
    database = Database("postgresql://nobody@127.0.0.1:1/none")  # never opened
    executor = build_executor(shared, database, rules, book)
    commits = tick_batch(running, NOW_MS, NAMES)
    plans: dict[str, Plan] = {}
    for run_id, run in running.items():
        batch_item = BatchItem(run_id, 0, ())
        plans[run_id] = decide(batch_item, run, commits[run_id], True, NOW_MS, rules)
    assert all(p.outcome is Outcome.COMMITTED and len(p.sends) == 2 for p in plans.values())

    def call() -> None:
        for message in messages:
            verdict = admit(message, NAMES, 1 << 20, NOW_MS)
            assert isinstance(verdict, Accepted)
            tracker.started(verdict.record.tp, verdict.record.offset)
            executor.add(verdict.record)
        for work in book.take_ready(100.0, len(messages)):
            executor.carry_out(work, plans[work.run_id])
        producer.purge()

    return call


def measure(batch: int, number: int, repeat: int) -> dict[str, float]:
    """µs of CPU per run of each phase: the minimum over ``repeat`` timings of ``number``
    calls. The thread's CPU time, not the wall clock: on a shared machine a preempted call
    does not count the other processes' time (four alternated rounds of two builds agreed
    within 2 % while wall-clock figures of the same rounds spread over x2)."""
    figures: dict[str, float] = {}
    for name, (call, per_call) in phases(batch).items():
        timer = timeit.Timer(call, timer=time.thread_time)
        best = min(timer.repeat(number=number, repeat=repeat))
        figures[name] = best / number / per_call * 1e6
    return figures


# glibc's malloc gives the top of its heap back to the kernel once that much is free, and
# serves blocks this large from mmap: with its defaults, some processes (at random, by where
# their heap ends) give memory back after each batch and fault it in again at the next one,
# ~1.7 page faults per run, +30 % on tick_result. --steady-malloc raises both thresholds in
# the children, so that the comparison is not decided by which process drew that.
_STEADY_MALLOC = {"MALLOC_TRIM_THRESHOLD_": "268435456", "MALLOC_MMAP_THRESHOLD_": "268435456"}


def _child(pure: bool, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("DUCTOR_PURE_PYTHON", None)
    if pure:
        env["DUCTOR_PURE_PYTHON"] = "1"
    if args.steady_malloc:
        env.update(_STEADY_MALLOC)
    command = [sys.executable, "-m", "processor.tools.bench_hot", "--json"]
    command += ["--batch", str(args.batch), "--number", str(args.number)]
    command += ["--repeat", str(args.repeat)]
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    answer: dict[str, Any] = json.loads(out)
    return answer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--batch", type=int, default=100, help="runs per batch (default 100)")
    parser.add_argument("--number", type=int, default=20, help="calls per timing (default 20)")
    parser.add_argument("--repeat", type=int, default=7, help="timings per phase (default 7)")
    parser.add_argument("--rounds", type=int, default=3, help="--compare: alternations")
    parser.add_argument("--compare", action="store_true", help="pure and compiled, alternated")
    parser.add_argument("--json", action="store_true", help="one line of JSON")
    parser.add_argument(
        "--steady-malloc", action="store_true", help="--compare: glibc's heap kept (see code)"
    )
    args = parser.parse_args(argv)
    if not args.compare:
        figures = measure(args.batch, args.number, args.repeat)
        if args.json:
            print(json.dumps({"compiled": compiled_modules(), "us": figures}))
        else:
            print(f"compiled modules: {len(compiled_modules())}")
            for name, us in figures.items():
                print(f"  {name:<12} {us:7.2f} µs")
        return
    pure: list[dict[str, float]] = []
    built: list[dict[str, float]] = []
    compiled: list[str] = []
    for _ in range(args.rounds):
        pure.append(_child(True, args)["us"])
        answer = _child(False, args)
        compiled = answer["compiled"]
        built.append(answer["us"])
    print(f"compiled modules: {len(compiled)}; µs per run, each round's min of {args.repeat}")
    width = 8 * args.rounds
    print(f"  {'phase':<12} {'pure':<{width}} {'compiled':<{width}} speedup (best/best)")
    for name in PHASES:
        p = [r[name] for r in pure]
        c = [r[name] for r in built]
        cells = " / ".join(f"{v:.2f}" for v in p), " / ".join(f"{v:.2f}" for v in c)
        print(f"  {name:<12} {cells[0]:<{width}} {cells[1]:<{width}} {min(p) / min(c):.2f}x")


if __name__ == "__main__":
    main()
