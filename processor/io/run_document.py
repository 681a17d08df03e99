"""Everything `ductor inspect` knows of one run, read in one place, and the document
`inspect --output json` prints (the web page of `ductor ui` shows the same document): the
run's columns, its state as loaded, its result and every attempt's timeline."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg

from processor.core.children import child_run_id
from processor.core.model import LoadedRun, NodeState, NodeStatus, RunStatus, shown_nodes
from processor.io.run_search import AttemptRow, attempt_rows
from processor.io.runs_admin import RunColumns, RunResult, run_columns, run_result
from processor.io.store import Definitions, load_runs


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

    @property
    def healthy(self) -> bool:
        """Loaded, its checksum right and not quarantined (`ductor inspect` exits 0)."""
        loaded = not isinstance(self.run, Exception) and self.run.checksum_ok
        return loaded and self.columns.quarantined_at is None


def read_run(
    conn: psycopg.Connection[Any], definitions: Definitions, run_id: str
) -> RunRecord | None:
    """The run's record, or None if there is no such run."""
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
    return RunRecord(run_id, columns, run, result, attempt_rows(conn, run_id), nodes)


def inspect_document(record: RunRecord) -> dict[str, Any]:
    """`ductor inspect --output json`: the run, its workflow's steps with their dependencies
    (its DAG), its nodes and every attempt's timeline (claimed by a worker at ``started``,
    its result at ``ended``). ``dispatched`` is known for the attempt in flight only (its
    deadline less the step's timeout): the coordinator keeps no time per past dispatch (it
    would cost a write per dispatch)."""
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
        "next_wakeup_at": _iso(columns.next_wakeup_at),
        "quarantine_reason": columns.quarantine_reason,
        "output": result.output if result.status is RunStatus.SUCCEEDED else None,
    }
    if isinstance(run, Exception):
        document["load_error"] = str(run)
        document["attempts"] = [_attempt_json(a, None) for a in record.attempts]
        return document
    document["seq"] = run.state.seq
    document["checksum_ok"] = run.checksum_ok
    document["parent"] = (
        None
        if run.parent is None
        else {"run_id": run.parent.run_id, "step": run.parent.node, "attempt": run.parent.attempt}
    )
    document["steps"] = [
        {"name": s.name, "kind": s.kind, "type": s.step_type, "after": list(s.depends_on)}
        for s in run.wf.steps
    ]
    in_flight: dict[tuple[str, int], int] = {}
    nodes = []
    for name, node in record.nodes:
        step = run.wf.step_for(name)
        if node.status is NodeStatus.DISPATCHED and node.due_ms is not None:
            in_flight[(name, node.attempt)] = node.due_ms - step.timeout_ms
        nodes.append(
            {
                "node": name,
                "status": node.status.value,
                "attempt": node.attempt,
                "error": node.error,
                "due": None if node.due_ms is None else _iso_ms(node.due_ms),
                "child_run": (
                    child_run_id(run_id, name, node.attempt)
                    if step.starts_child and node.attempt
                    else None
                ),
            }
        )
    document["nodes"] = nodes
    document["attempts"] = [
        _attempt_json(a, in_flight.get((a.node, a.attempt))) for a in record.attempts
    ]
    return document


def _attempt_json(attempt: AttemptRow, dispatched_ms: int | None) -> dict[str, Any]:
    started, ended = attempt.started_at, attempt.ended_at
    duration = None if started is None or ended is None else (ended - started).total_seconds()
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
        "error": attempt.error,
    }


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat()


def _iso_ms(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="milliseconds")
