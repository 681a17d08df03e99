"""A Postgres that fails over (infra/local.py's PostgresPair: a primary and a synchronous
streaming standby from Debian's packages, on ports of their own): the primary is SIGKILLed
while runs flow and the standby promoted, as Patroni would. A processor and a worker on a
multi-host DSN (target_session_attrs=read-write) follow it with one outage each; nothing that
was committed is lost, nothing is applied twice, every run ends, no process exits."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from infra.local import PostgresPair, StopMode
from infra.local import Settings as InfraSettings
from processor.client import start_runs
from processor.io.config.settings import Settings
from processor.io.postgres.workflows import register_workflow
from processor.tools import audit as audit_trail

from . import counted_steps
from .audit import assert_results_applied, assert_transitions_applied_once
from .children import run_ductor
from .runs import count_terminal, run_statuses
from .test_once_per_attempt import APP, _quad
from .waiting import wait_for

pytestmark = pytest.mark.integration

RUNS = 500
# The primary; the standby on the next port. Below Linux's ephemeral range (32768-60999): a
# port in it can be held by any client socket of the tests (CI once found 56432 taken).
PORT = 26432


@pytest.fixture(scope="module")
def pair() -> Iterator[PostgresPair]:
    servers = PostgresPair(InfraSettings.from_env(), PORT)
    servers.up()
    try:
        yield servers
    finally:
        servers.down(StopMode.KILL)


def test_the_primary_killed_under_load_fails_over_to_the_standby_losing_nothing(
    settings: Settings, spawn: Any, pair: PostgresPair
) -> None:
    on_pair = replace(settings, pg_dsn=pair.dsn)
    assert run_ductor(on_pair, "migrate").returncode == 0
    name = f"failover-{uuid.uuid4().hex[:6]}"
    with psycopg.connect(pair.dsn, autocommit=True) as conn:
        audit_trail.install(conn)  # (the standby has it too: a trigger, replicated)
        audit_trail.clear(conn)
        counted_steps.install(conn)
        # Retries that outlast a failover: a step whose own write fails while no server takes
        # writes fails its attempt; the next one runs after the promotion.
        register_workflow(conn, _quad(name, retry={"max_attempts": 8, "backoff_ms": 500}))
    processor = spawn(["process"], on_pair, "process")
    worker = spawn(["worker", "--app", APP], on_pair, "worker")
    members = (processor, worker)
    wait_for(
        lambda: all(m.owned_partitions() > 0 for m in members), 60, "both members to own partitions"
    )
    tag = uuid.uuid4().hex[:6]
    run_ids = [f"fo-{tag}-{i}" for i in range(RUNS)]
    start_runs(on_pair, name, run_ids, {"sleep_ms": 5})

    def running() -> bool:
        return all(member.running() for member in members)

    with psycopg.connect(pair.dsn, autocommit=True) as conn:
        wait_for(lambda: running() and count_terminal(conn, run_ids) >= RUNS // 5, 120, "a fifth")
    pair.primary.down(StopMode.KILL)
    # Everything a client was told is committed, as the standby has it at the kill (flushed
    # there before the commit returned; replayed for reading once it has replayed all).
    with psycopg.connect(pair.standby.dsn, autocommit=True) as standby:
        wait_for(
            lambda: (
                standby.execute(
                    "SELECT pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn()"
                ).fetchone()
                == (True,)
            ),
            30,
            "the standby to replay what it received",
        )
        ended = {r for r, status in run_statuses(standby, run_ids).items() if status == "succeeded"}
    # No server takes writes until the promotion: both members are in an outage first.
    wait_for(
        lambda: all(m.outages("postgres") for m in members), 30, "both members to see the outage"
    )
    promoting_at = time.monotonic()
    pair.promote()  # (returns once the standby takes writes)
    promoted_at = time.monotonic()
    with psycopg.connect(pair.dsn, autocommit=True) as conn:
        wait_for(
            lambda: running() and count_terminal(conn, run_ids) > len(ended),
            60,
            "runs to end again on the promoted standby",
            0.2,
        )
        resumed_s = time.monotonic() - promoted_at
        wait_for(lambda: running() and count_terminal(conn, run_ids) == RUNS, 300, "every run", 0.5)
        for member in members:
            assert member.terminate() == 0, f"{member.log_path.name} did not stop cleanly"
        statuses = run_statuses(conn, run_ids)
        assert set(statuses.values()) == {"succeeded"}
        assert ended and all(statuses[r] == "succeeded" for r in ended)
        assert_results_applied(conn, run_ids)
        assert_transitions_applied_once(conn)
        counts = counted_steps.executions(conn, f"fo-{tag}")
    extra = counted_steps.extra_executions(counts)
    outages = [m.outages("postgres") for m in members]
    print(
        f"failover: {len(ended)} runs had ended at the kill; the promotion took"
        f" {promoted_at - promoting_at:.1f} s, runs ended again {resumed_s:.2f} s after it;"
        f" {extra} extra executions of {len(counts)} attempts;"
        f" outage lines {outages}"
    )
    assert outages == [1, 1], outages
    assert extra <= 0.005 * len(counts), (extra, len(counts))
