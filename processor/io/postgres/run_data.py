"""What a run was given, as a look at it shows it (`ductor inspect`, the client, the run's
page: io/postgres/run_document.py): its input and the signals it received, each value cut in
the statement (core/shown.py). Its steps' outputs and failures are read with its attempts
(io/postgres/run_search.py). Not a hot path: a person's look at one run."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from processor.core.shown import SHOWN_CHARS, Shown, shown

# The signals a look shows: the first ones received (a wait step takes the first of its
# name), and how many there are in all. A run may get thousands (core/bounds.py bounds each,
# not how many).
SIGNALS_SHOWN = 100


@dataclass(frozen=True)
class ReceivedSignal:
    """A signal recorded for the run: its id (its idempotency key), its name (``cancel``, or
    one a wait step waits for), when it was recorded, and its payload (cut)."""

    signal_id: str
    name: str
    received_at: datetime
    payload: Shown


@dataclass(frozen=True)
class Signals:
    """The first SIGNALS_SHOWN signals the run received, in the order recorded, and how
    many it received."""

    shown: tuple[ReceivedSignal, ...]
    total: int


NO_SIGNALS = Signals((), 0)


def run_input(conn: psycopg.Connection[Any], run_id: str) -> Shown | None:
    """The run's input (cut), or None if there is no such run."""
    row = conn.execute(
        "SELECT left(input::text, %(chars)s + 1), length(input::text)"
        " FROM eec_workflow_run WHERE run_id = %(run_id)s",
        {"run_id": run_id, "chars": SHOWN_CHARS},
    ).fetchone()
    if row is None:
        return None
    text, chars = row
    return shown("null", 4) if text is None else shown(text, chars)


# The signals' primary key serves both statements; only the signals shown are cut and sent.
_SIGNALS_SQL = """
SELECT s.signal_id, s.kind, s.received_at, left(s.payload::text, %(chars)s + 1),
       length(s.payload::text)
  FROM (SELECT * FROM eec_run_signal WHERE run_id = %(run_id)s
         ORDER BY received_at, signal_id LIMIT %(limit)s) AS s
 ORDER BY s.received_at, s.signal_id
"""


def run_signals(conn: psycopg.Connection[Any], run_id: str, limit: int = SIGNALS_SHOWN) -> Signals:
    """The first ``limit`` signals recorded for the run, and how many were."""
    params = {"run_id": run_id, "chars": SHOWN_CHARS, "limit": limit}
    rows = conn.execute(_SIGNALS_SQL, params).fetchall()
    total = len(rows)
    if total == limit:
        counted = conn.execute(
            "SELECT count(*) FROM eec_run_signal WHERE run_id = %s", (run_id,)
        ).fetchone()
        total = 0 if counted is None else int(counted[0])
    return Signals(
        tuple(
            ReceivedSignal(signal_id, name, at, shown(text, chars))
            for signal_id, name, at, text, chars in rows
        ),
        total,
    )
