"""Everything `ductor inspect` knows of one run, read in one place, and the document
`inspect --output json` prints (the web page of `ductor ui` shows the same document): the
run's columns, its state as loaded, its result, its input and the signals it received, every
attempt's timeline with its output or its error and traceback, and what the workers report of
each attempt's execution: its last heartbeat and what the step said with it, whether it still
runs, and the concurrency slots it keeps after its attempt ended (core/limits.py, rule 4).
Every value a step or a caller gave is cut to a bound (core/shown.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg

from processor.core.children import child_run_id
from processor.core.model import LoadedRun
from processor.core.run_state import NodeState, NodeStatus, RunStatus, shown_nodes
from processor.core.sagas import compensation_of
from processor.core.shapes import AttemptRef
from processor.core.shown import Shown
from processor.core.skips import why_skipped
from processor.core.versions import step_versions
from processor.io.postgres.instances import alive
from processor.io.postgres.key_slots import KeySlot, key_slot
from processor.io.postgres.run_data import NO_SIGNALS, Signals, run_input, run_signals
from processor.io.postgres.run_search import AttemptRow, attempt_rows
from processor.io.postgres.runs_admin import RunColumns, RunResult, run_columns, run_result
from processor.io.postgres.store import Definitions, load_runs


@dataclass(frozen=True)
class Execution:
    """What the worker that runs (or ran) an attempt reports of its execution
    (io/postgres/step_attempts.py): its last heartbeat, recorded at ``beat_at`` (None: none), with
    the details the step gave (or an earlier execution of it gave), whether it ended, whether it
    still runs (its worker alive, its end not reported), and the concurrency slots it keeps
    although its attempt ended (``lingering``: their counters' keys)."""

    beat_at: datetime | None
    details: Any
    ended_at: datetime | None
    running: bool
    lingering: tuple[str, ...] = ()
    # The version of its step's function it ran with (core/versions.py); None: a worker from
    # before versions claimed it (version 1).
    version: int | None = None


_EXECUTIONS_SQL = f"""
SELECT a.node_id, a.attempt, a.beat_at, a.beat_details, a.ended_at,
       a.reports AND a.ended_at IS NULL AND {alive("a.worker_id")},
       ARRAY(SELECT h.key FROM eec_limit_hold h
              WHERE h.run_id = a.run_id AND h.node = a.node_id AND h.attempt = a.attempt
                AND h.lingering_since IS NOT NULL ORDER BY h.key),
       a.step_version
  FROM eec_step_attempt a WHERE a.run_id = %(run_id)s
"""


def executions(
    conn: psycopg.Connection[Any], run_id: str, gone_after_s: float
) -> dict[AttemptRef, Execution]:
    """What the workers report of the executions of the run's attempts, by (node, attempt)
    (``gone_after_s``: the heartbeat age after which a worker is gone)."""
    rows = conn.execute(_EXECUTIONS_SQL, {"run_id": run_id, "gone_after_s": gone_after_s})
    return {
        (node, attempt): Execution(
            beat_at, details, ended_at, bool(running), tuple(lingering), version
        )
        for node, attempt, beat_at, details, ended_at, running, lingering, version in rows
    }


@dataclass(frozen=True)
class RunRecord:
    """A run as stored: its columns, its state (or why it cannot be loaded), its result, its
    attempts and its nodes as shown (a map's items all of them: core/model.shown_nodes)."""

    run_id: str
    columns: RunColumns
    run: LoadedRun | Exception
    result: RunResult
    attempts: list[AttemptRow]
    nodes: tuple[tuple[str, NodeState], ...] = ()
    executions: dict[AttemptRef, Execution] = field(default_factory=dict)
    input: Shown | None = None
    signals: Signals = NO_SIGNALS
    key: KeySlot | None = None  # its workflow's concurrency: its standing with its key

    @property
    def healthy(self) -> bool:
        """Loaded, its checksum right and not quarantined (`ductor inspect` exits 0)."""
        loaded = not isinstance(self.run, Exception) and self.run.checksum_ok
        return loaded and self.columns.quarantined_at is None


def read_run(
    conn: psycopg.Connection[Any],
    definitions: Definitions,
    run_id: str,
    gone_after_s: float = 5.0,
) -> RunRecord | None:
    """The run's record, or None if there is no such run (``gone_after_s``: the heartbeat
    age after which a worker is gone, DUCTOR_INSTANCE_TIMEOUT_S)."""
    columns = run_columns(conn, run_id)
    run = load_runs(conn, definitions, [run_id]).get(run_id)
    result = run_result(conn, run_id)
    if columns is None or run is None or result is None:
        return None
    nodes: tuple[tuple[str, NodeState], ...] = ()
    if not isinstance(run, Exception):
        recorded = {}
        if run.state.maps:
            recorded = {
                (node, item): attempt
                for node, item, attempt in conn.execute(
                    "SELECT node, item, attempt FROM eec_map_item WHERE run_id = %s", (run_id,)
                ).fetchall()
            }
        nodes = shown_nodes(run.state, recorded)
    # (But the marks of attempts that failed never started: io/postgres/store.py, of no worker.)
    attempts = [a for a in attempt_rows(conn, run_id) if a.worker_id != ""]
    return RunRecord(
        run_id,
        columns,
        run,
        result,
        attempts,
        nodes,
        executions(conn, run_id, gone_after_s),
        run_input(conn, run_id),
        run_signals(conn, run_id),
        _key_slot(conn, run),
    )


def _key_slot(conn: psycopg.Connection[Any], run: LoadedRun | Exception) -> KeySlot | None:
    """A run of a workflow with ``concurrency``: its standing with its key."""
    if isinstance(run, Exception) or run.wf.concurrency is None:
        return None
    return key_slot(conn, run.run_id, run.wf.concurrency)


def inspect_document(record: RunRecord) -> dict[str, Any]:
    """`ductor inspect --output json`: the run, its workflow's steps with their dependencies
    (its DAG), its nodes and every attempt's timeline (claimed by a worker at ``started``,
    its result at ``ended``). ``dispatched`` is known for the attempt in flight only, while
    its due time is still the one of its dispatch (its dispatch plus its timeout) or when its
    step bounds its wait in the queue (``since_ms``): the coordinator keeps no time per past
    dispatch (it would cost a write per dispatch)."""
    columns, run, result, run_id = record.columns, record.run, record.result, record.run_id
    document: dict[str, Any] = {
        "run_id": run_id,
        "workflow": columns.workflow[0],
        "version": columns.workflow[1],
        "status": columns.status,
        "failure_reason": columns.failure_reason,
        "tier": columns.tier,
        "tags": dict(columns.tags),
        "created_at": columns.created_at.isoformat(),
        "updated_at": columns.updated_at.isoformat(),
        "start_at": _iso(columns.start_at),
        "deadline_at": _iso(columns.deadline_at),
        "timeout_ms": columns.timeout_ms,
        "next_wakeup_at": _iso(columns.next_wakeup_at),
        "quarantine_reason": columns.quarantine_reason,
        "output": result.output if result.status is RunStatus.SUCCEEDED else None,
        "input": None if record.input is None else record.input.document(),
        "signals": _signals_json(record),
        "signal_count": record.signals.total,
        # Its workflow's concurrency (core/run_keys.py): the key's value, whether the run
        # holds a slot or waits for one (its place in its key's line); None without one.
        "key": None if record.key is None else record.key.document(),
    }
    if isinstance(run, Exception):
        document["load_error"] = str(run)
        document["attempts"] = [_attempt_json(a, None) for a in record.attempts]
        return document
    document["seq"] = run.state.seq
    document["checksum_ok"] = run.checksum_ok
    # What became of its saga (core/sagas.py): none, running, completed or failed (at step).
    document["compensation"] = compensation_of(run.state, run.wf)._asdict()
    document["parent"] = (
        None
        if run.parent is None
        else {"run_id": run.parent.run_id, "step": run.parent.node, "attempt": run.parent.attempt}
    )
    document["steps"] = _steps_json(run)
    nodes, in_flight = _nodes_json(record, run)
    document["nodes"] = nodes
    document["attempts"] = [
        _attempt_json(
            a, in_flight.get((a.node, a.attempt)), record.executions.get((a.node, a.attempt))
        )
        for a in record.attempts
    ]
    return document


def _signals_json(record: RunRecord) -> list[dict[str, Any]]:
    return [
        {
            "signal_id": s.signal_id,
            "name": s.name,
            "received_at": s.received_at.isoformat(),
            "payload": s.payload.document(),
        }
        for s in record.signals.shown
    ]


def _steps_json(run: LoadedRun) -> list[dict[str, Any]]:
    """The workflow's steps, its DAG: each with its dependencies and its condition, and a
    step a worker runs with the version of its function the run pinned (core/versions.py)."""
    pins = step_versions(run.wf, run.state.versions)
    return [
        {"name": s.name, "kind": s.kind, "type": s.step_type, "after": list(s.depends_on)}
        | ({} if s.when is None else {"when": s.when.text})
        | ({} if s.run_if is None else {"run_if": s.run_if})
        | ({} if s.compensate is None else {"compensate": s.compensate.step_type})
        | ({"version": pins[s.name]} if s.name in pins else {})
        for s in run.wf.steps
    ]


def _nodes_json(
    record: RunRecord, run: LoadedRun
) -> tuple[list[dict[str, Any]], dict[AttemptRef, int]]:
    """The run's nodes as the document shows them, and when each attempt in flight was
    dispatched, where that is known (see ``inspect_document``)."""
    in_flight: dict[AttemptRef, int] = {}
    claimed = {(a.node, a.attempt): a.started_at for a in record.attempts}
    outputs = {(a.node, a.attempt): a.output for a in record.attempts}
    nodes = []
    state_nodes = run.state.node_map()
    for name, node in record.nodes:
        step = run.wf.step_for(name)
        if node.status is NodeStatus.DISPATCHED and node.due_ms is not None:
            dispatched = _dispatched_ms(node, step.timeout_ms, step.heartbeat_timeout_ms)
            start = claimed.get((name, node.attempt))
            if dispatched is not None and (
                node.since_ms is not None or start is None or dispatched < _ms(start)
            ):
                in_flight[(name, node.attempt)] = dispatched
        nodes.append(
            {
                "node": name,
                "status": node.status.value,
                "attempt": node.attempt,
                "error": node.error,
                # The output of its current attempt, once it succeeded (cut).
                "output": _shown(outputs.get((name, node.attempt))),
                "due": None if node.due_ms is None else _iso_ms(node.due_ms),
                # A skipped step's why (core/skips.py); None for every other.
                "skipped": (
                    why_skipped(step, state_nodes) if node.status is NodeStatus.SKIPPED else None
                ),
                "child_run": (
                    child_run_id(record.run_id, name, node.attempt)
                    if step.starts_child and node.attempt
                    else None
                ),
            }
        )
    return nodes, in_flight


def _attempt_json(
    attempt: AttemptRow, dispatched_ms: int | None, execution: Execution | None = None
) -> dict[str, Any]:
    started, ended = attempt.started_at, attempt.ended_at
    duration = None if started is None or ended is None else (ended - started).total_seconds()
    beat = None
    if execution is not None and (execution.beat_at is not None or execution.details is not None):
        beat = {"at": _iso(execution.beat_at), "details": execution.details}
    return {
        "node": attempt.node,
        "attempt": attempt.attempt,
        "dispatched": None if dispatched_ms is None else _iso_ms(dispatched_ms),
        "started": _iso(started),
        "ended": _iso(ended),
        "worker": attempt.worker_id,
        "executions": attempt.starts,
        "duration_s": duration,
        "outcome": attempt.outcome,
        "output": _shown(attempt.output),
        # A failure: "Type: message" as the run's state quotes it; the exception's type and
        # message apart when its step raised one, with its traceback (from the user's code
        # on, bounded), or the sentence that says why there is none (its process died).
        "error": attempt.error,
        "error_type": attempt.error_type,
        "error_message": error_message(attempt.error, attempt.error_type),
        "traceback": attempt.traceback,
        # What its worker reports: its last heartbeat and the details with it; whether its
        # execution still runs (None: its worker reports no such thing); the concurrency
        # slots it keeps after its attempt ended (a step in a thread cannot be stopped).
        "heartbeat": beat,
        "running": None if execution is None else execution.running,
        "execution_ended": None if execution is None else _iso(execution.ended_at),
        "holds_slots": [] if execution is None else list(execution.lingering),
        # The version of its step's function it ran with (None: not claimed by a worker
        # that says: one from before versions ran version 1).
        "version": None if execution is None else execution.version,
    }


def error_message(error: str | None, error_type: str | None) -> str | None:
    """The message of an attempt's error without its exception's type, which it starts
    with when the step raised it (worker/steps.py: ``"Type: message"``)."""
    if error is None or error_type is None or not error.startswith(f"{error_type}: "):
        return error
    return error[len(error_type) + 2 :]


def _shown(value: Shown | None) -> dict[str, Any] | None:
    return None if value is None else value.document()


def _dispatched_ms(node: NodeState, timeout_ms: int, heartbeat_ms: int | None) -> int | None:
    """When the attempt in flight was dispatched, if its state still says: ``since_ms``, or
    its due time less its timeout (a due time that moved to its start plus its timeout says
    when it started, not when it was dispatched: the caller checks)."""
    if node.since_ms is not None:
        return node.since_ms
    if node.due_ms is None or heartbeat_ms is not None:
        return None
    return node.due_ms - timeout_ms


def _ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat()


def _iso_ms(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="milliseconds")
