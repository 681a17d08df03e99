"""Registering workflow definitions (``eec_workflow_definition``; a registered version is
immutable, and no registration may close a cycle of child workflows), and what is
registered: the versions and the queues their steps run on.

A registration from Python also keeps the text of the module that wrote the workflow
(core/workflow_source.py), for people to read: the latest such registration's text replaces the
kept one (the steps' code changes without a new version; the page shows what was last
registered, and when), one from JSON leaves it. Versions are still compared by their JSON only.

Like ``store.py``, every statement is one round trip on an autocommit connection (a
registration that starts children takes one transaction, for its lock).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import psycopg

from processor.core.child_graph import ChildCycle, ChildRef, child_cycle
from processor.core.routing import DEFAULT_QUEUE
from processor.core.shapes import WorkflowKey
from processor.core.workflow import parse_workflow, workflow_to_json
from processor.core.workflow_def import WorkflowDef
from processor.core.workflow_source import WorkflowSource

# Registrations of definitions that start children take turns (a transaction-scoped advisory
# lock, this key): two registered at once could each close half of a cycle unseen.
_CHILD_GRAPH_LOCK = 0x64756374  # "duct"


def register_workflow(
    conn: psycopg.Connection[Any], wf: WorkflowDef, source: WorkflowSource | None = None
) -> bool:
    """Register a definition, with the Python ``source`` it was written in if any; True if
    new. Re-registering the same content is a no-op but for the source it brings, which
    replaces the kept one; a different content under an existing (name, version) is refused
    (versions are immutable), and so is one whose step starts a child run of a workflow
    (version) not registered, or whose registration would close a cycle of child workflows
    (ChildCycle: core/child_graph.py).
    """
    if not wf.has_children:
        return _register(conn, wf, source)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_CHILD_GRAPH_LOCK,))
        _check_children_registered(conn, wf)
        new = _register(conn, wf, source)
        if new:  # read with the new row, in this transaction: raising takes it back
            cycle = child_cycle(wf.key, _child_graph(conn))
            if cycle is not None:
                raise ChildCycle(wf.key, cycle)
        return new


def _check_children_registered(conn: psycopg.Connection[Any], wf: WorkflowDef) -> None:
    for step in wf.steps:
        if step.starts_child:
            row = conn.execute(
                "SELECT 1 FROM eec_workflow_definition WHERE name = %s"
                " AND (%s::integer IS NULL OR version = %s::integer) LIMIT 1",
                (step.child_workflow, step.child_version, step.child_version),
            ).fetchone()
            if row is None:
                which = "" if step.child_version is None else f" version {step.child_version}"
                raise ValueError(
                    f"step {step.name!r} starts workflow {step.child_workflow!r}{which}, which"
                    " is not registered: register it first"
                )


def _child_graph(conn: psycopg.Connection[Any]) -> dict[WorkflowKey, list[ChildRef]]:
    """Every registered version with the children its steps start (core/child_graph.py)."""
    rows = conn.execute(
        "SELECT w.name, w.version, st ->> 'workflow', st ->> 'version'"
        " FROM eec_workflow_definition w"
        f" LEFT JOIN LATERAL {_STEPS.format(d='w.definition')} AS st"
        "   ON st ->> 'kind' = 'workflow' AND jsonb_typeof(st -> 'workflow') = 'string'"
    ).fetchall()
    graph: dict[WorkflowKey, list[ChildRef]] = {}
    for name, version, child, child_version in rows:
        refs = graph.setdefault((name, version), [])
        if child is not None:
            pinned = int(child_version) if child_version and child_version.isdigit() else None
            refs.append((child, pinned))
    return graph


_INSERT = (
    "INSERT INTO eec_workflow_definition (name, version, definition) VALUES (%s, %s, %s)"
    " ON CONFLICT (name, version) DO NOTHING RETURNING 1"
)
_INSERT_WITH_SOURCE = (
    "INSERT INTO eec_workflow_definition"
    " (name, version, definition, source, source_module, source_at)"
    " VALUES (%s, %s, %s, %s, %s, now()) ON CONFLICT (name, version) DO NOTHING RETURNING 1"
)


def _register(
    conn: psycopg.Connection[Any], wf: WorkflowDef, source: WorkflowSource | None
) -> bool:
    body = orjson.dumps(workflow_to_json(wf)).decode()
    text, module = (None, None) if source is None else (source.text, source.module)
    # A definition without source names only the columns every schema since 0001 has: a
    # database not yet migrated to 0042 still takes it.
    if source is None:
        row = conn.execute(_INSERT, (wf.name, wf.version, body)).fetchone()
    else:
        row = conn.execute(
            _INSERT_WITH_SOURCE, (wf.name, wf.version, body, text, module)
        ).fetchone()
    if row is not None:
        return True
    existing = conn.execute(
        "SELECT definition FROM eec_workflow_definition WHERE name = %s AND version = %s",
        (wf.name, wf.version),
    ).fetchone()
    if existing is not None and parse_workflow(existing[0]) != wf:
        raise ValueError(
            f"workflow {wf.name!r} version {wf.version} is already registered with a different"
            " definition; register it under a new version"
        )
    if source is not None:  # the same definition, from code: its text is the one to show
        conn.execute(
            "UPDATE eec_workflow_definition SET source = %s, source_module = %s,"
            " source_at = now() WHERE name = %s AND version = %s"
            " AND (source, source_module) IS DISTINCT FROM (%s, %s)",
            (text, module, wf.name, wf.version, text, module),
        )
    return False


# The steps of definition {d}, as rows: none for a definition written by hand whose ``steps``
# is not a list (it cannot be run; a listing or a topic creation must not fail on it).
_STEPS = """jsonb_array_elements(CASE WHEN jsonb_typeof({d} -> 'steps') = 'array'
                                   THEN {d} -> 'steps' ELSE '[]'::jsonb END)"""


@dataclass(frozen=True)
class WorkflowVersion:
    """One registered version of a workflow, as ``ductor workflows list`` shows it."""

    name: str
    version: int
    registered_at: datetime
    steps: tuple[str, ...]


def workflow_versions(conn: psycopg.Connection[Any]) -> list[WorkflowVersion]:
    """Every registered version, by name, then version."""
    rows = conn.execute(
        "SELECT name, version, registered_at,"
        f" ARRAY(SELECT st ->> 'name' FROM {_STEPS.format(d='definition')} AS st)"
        " FROM eec_workflow_definition ORDER BY name, version"
    ).fetchall()
    return [WorkflowVersion(n, v, at, tuple(steps)) for n, v, at, steps in rows]


def registered_queues(conn: psycopg.Connection[Any]) -> list[str]:
    """The queues the steps of the registered workflows name (each its steps topic)."""
    rows = conn.execute(
        "SELECT DISTINCT coalesce(st ->> 'queue', %s) FROM eec_workflow_definition w,"
        f" {_STEPS.format(d='w.definition')} AS st ORDER BY 1",
        (DEFAULT_QUEUE,),
    ).fetchall()
    return [r[0] for r in rows]


@dataclass(frozen=True)
class KeptSource:
    """The Python a version was last registered from: its module's name and text (bounded),
    and when that registration kept them."""

    module: str
    text: str
    kept_at: datetime


@dataclass(frozen=True)
class StoredVersion:
    """A registered version as stored: its definition (its JSON, as written: one written by
    hand may not parse), when it was registered, and its source if it came from code."""

    definition: Any
    registered_at: datetime
    source: KeptSource | None


def stored_version(conn: psycopg.Connection[Any], name: str, version: int) -> StoredVersion | None:
    """A registered version as stored; None if there is no such version."""
    row = conn.execute(
        "SELECT definition, registered_at, source, source_module, source_at"
        " FROM eec_workflow_definition WHERE name = %s AND version = %s",
        (name, version),
    ).fetchone()
    if row is None:
        return None
    definition, registered_at, text, module, kept_at = row
    source = None if text is None else KeptSource(module or "", text, kept_at or registered_at)
    return StoredVersion(definition, registered_at, source)
