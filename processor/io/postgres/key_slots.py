"""Where a run of a workflow with ``concurrency`` stands with its key (core/run_keys.py), as
`ductor inspect`, the run document and the page show it: the key's value, whether the run
holds a slot, or waits for one (since when, its place in its key's line), and how many of the
key's runs are live. One statement, read only for such a run."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, NamedTuple

import psycopg

from processor.core.limit_defs import RunKeyLimit
from processor.core.run_keys import RUN_NODE
from processor.io.postgres.limit_store import LIVE_WAITER


class KeySlot(NamedTuple):
    """A run's standing with its key: ``value`` (what its input holds at the key's path),
    ``holds`` (it is live, holding a slot), ``since`` and ``place`` (waiting since then,
    1: next in line), ``live``: how many runs hold a slot of the key (of ``limit``)."""

    limit: RunKeyLimit
    value: str
    holds: bool
    since: datetime | None
    place: int | None
    live: int

    def document(self) -> dict[str, Any]:
        return {
            "limit": self.limit.name,
            "key": ".".join(self.limit.key),
            "value": self.value,
            "holds_slot": self.holds,
            "waiting_since": None if self.since is None else self.since.isoformat(),
            "place": self.place,
            "live": self.live,
            "of": self.limit.limit,
        }

    def line(self) -> str:
        """What `ductor inspect` prints of it."""
        key = ".".join(self.limit.key) or "(every run)"
        said = f"{key}={self.value}" if self.limit.key else key
        live = f"{self.live} of {self.limit.limit} live"
        if self.place is not None:
            return f"{said}: waits for a slot, place {self.place} in line, {live}"
        return f"{said}: {'holds a slot' if self.holds else 'holds no slot'}, {live}"


_KEY_SQL = """
SELECT k.key,
       EXISTS (SELECT 1 FROM eec_limit_hold h
                WHERE h.run_id = %(run_id)s AND h.node = %(node)s AND h.key = k.key),
       w.since_ms,
       CASE WHEN w.since_ms IS NULL THEN NULL ELSE 1 + (
            SELECT count(*) FROM eec_limit_wait q
             WHERE q.key = k.key
               AND (q.round, q.since_ms, q.run_id, q.node) < (w.round, w.since_ms, w.run_id, w.node)
               AND {live}) END,
       (SELECT count(*) FROM eec_limit_hold h WHERE h.key = k.key)
  FROM (SELECT coalesce(
            (SELECT key FROM eec_limit_hold WHERE run_id = %(run_id)s AND node = %(node)s
              AND key LIKE %(prefix)s LIMIT 1),
            (SELECT key FROM eec_limit_wait WHERE run_id = %(run_id)s AND node = %(node)s
              AND key LIKE %(prefix)s LIMIT 1)) AS key) k
  LEFT JOIN eec_limit_wait w ON w.key = k.key AND w.run_id = %(run_id)s AND w.node = %(node)s
 WHERE k.key IS NOT NULL
""".replace("{live}", LIVE_WAITER)


def key_slot(conn: psycopg.Connection[Any], run_id: str, limit: RunKeyLimit) -> KeySlot | None:
    """The run's standing with its key; None when it neither holds nor waits for a slot (a
    run not started yet, or ended)."""
    prefix = limit.key_of("")
    like = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    row = conn.execute(_KEY_SQL, {"run_id": run_id, "node": RUN_NODE, "prefix": like}).fetchone()
    if row is None:
        return None
    key, holds, since_ms, place, live = row
    since = None if since_ms is None else datetime.fromtimestamp(since_ms / 1000, UTC)
    return KeySlot(limit, key[len(prefix) :], bool(holds), since, place, int(live))
