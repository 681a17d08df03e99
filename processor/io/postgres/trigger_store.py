"""The triggers in ``eec_trigger`` (migration 0013): created, listed and deleted by
``ductor triggers``, read by the processors (core/triggers.py says what one is)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
import psycopg

from processor.core.triggers import Trigger, parse_trigger


class TriggerConflict(ValueError):
    """A trigger that cannot be created: its name or its topic is another trigger's."""


@dataclass(frozen=True)
class StoredTrigger:
    name: str
    created_at: datetime
    trigger: Trigger | None  # None: its stored definition cannot be read (``problem``)
    definition: Any
    problem: str = ""


@dataclass(frozen=True)
class TriggerSet:
    """The triggers a processor follows, by source topic, and those it cannot read."""

    by_topic: Mapping[str, Trigger] = field(default_factory=dict)
    unreadable: Mapping[str, str] = field(default_factory=dict)  # name: why


def create_trigger(
    conn: psycopg.Connection[Any], trigger: Trigger, start_offsets: Mapping[int, int]
) -> bool:
    """Store the trigger, its topic's partitions starting at ``start_offsets``; False if the
    same one exists already (its start is left as it was). TriggerConflict if its name or its
    topic belongs to another."""
    definition = trigger.to_json()
    with conn.transaction():
        row = conn.execute(
            "INSERT INTO eec_trigger (name, source_topic, definition, start_offsets)"
            " VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1",
            (
                trigger.name,
                trigger.topic,
                orjson.dumps(definition).decode(),
                orjson.dumps({str(p): o for p, o in start_offsets.items()}).decode(),
            ),
        ).fetchone()
        if row is not None:
            return True
        same = conn.execute(
            "SELECT name, source_topic, definition FROM eec_trigger"
            " WHERE name = %s OR source_topic = %s",
            (trigger.name, trigger.topic),
        ).fetchall()
    for name, topic, stored in same:
        if name == trigger.name and stored == definition:
            return False
        if name == trigger.name:
            raise TriggerConflict(
                f"trigger {name!r} exists already with another definition (on topic {topic});"
                " delete it first (ductor triggers delete)"
            )
        raise TriggerConflict(
            f"topic {topic!r} has a trigger already, {name!r}: one trigger per topic"
        )
    raise TriggerConflict(f"trigger {trigger.name!r} was deleted meanwhile; try again")


def list_triggers(conn: psycopg.Connection[Any]) -> list[StoredTrigger]:
    """Every trigger, by name; one whose definition cannot be read says why."""
    stored = []
    rows = conn.execute(
        "SELECT name, created_at, definition, start_offsets FROM eec_trigger ORDER BY name"
    ).fetchall()
    for name, created_at, definition, offsets in rows:
        try:
            start = tuple(sorted((int(p), int(o)) for p, o in dict(offsets).items()))
            trigger = parse_trigger(name, definition, start)
        except (ValueError, TypeError) as exc:
            stored.append(StoredTrigger(name, created_at, None, definition, str(exc)))
            continue
        stored.append(StoredTrigger(name, created_at, trigger, definition))
    return stored


def delete_trigger(conn: psycopg.Connection[Any], name: str) -> bool:
    row = conn.execute("DELETE FROM eec_trigger WHERE name = %s RETURNING 1", (name,)).fetchone()
    return row is not None


def load_triggers(conn: psycopg.Connection[Any]) -> TriggerSet:
    """What the processors follow: one trigger that cannot be read stops nothing but itself."""
    by_topic: dict[str, Trigger] = {}
    unreadable: dict[str, str] = {}
    for stored in list_triggers(conn):
        if stored.trigger is None:
            unreadable[stored.name] = stored.problem
        else:
            by_topic[stored.trigger.topic] = stored.trigger
    return TriggerSet(by_topic, unreadable)
