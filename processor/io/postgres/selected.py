"""What the ``until`` selectors of sleep steps find (core/selectors.py, core/sleeps.py), read
with the batch's load (io/postgres/store.py) for the runs that have such a step not yet
started, and only for them: every other run costs nothing more, and one that does costs one
statement for the whole batch, which returns the selected values alone (``#>``), never a
whole input or output.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import psycopg

from processor.core.model import LoadedRun
from processor.core.run_state import NodeStatus
from processor.core.sleeps import Selected

# For each (run, step, source, path): whether the source is recorded (the run's input always
# is; a step's output once its success is), and what the path finds in it, as [value] (a JSON
# null found is [null]) or null when nothing is there.
_SELECTED_SQL = """
SELECT coalesce(json_agg(json_build_array(q.run_id, q.step, v.recorded,
                                          CASE WHEN v.value IS NOT NULL
                                               THEN jsonb_build_array(v.value) END)), '[]')::text
  FROM jsonb_to_recordset(%s::jsonb) AS q(run_id text, step text, source text, path text[])
 CROSS JOIN LATERAL (
       SELECT true AS recorded, r.input #> q.path AS value
         FROM eec_workflow_run r
        WHERE q.source IS NULL AND r.run_id = q.run_id
       UNION ALL
       (SELECT true, s.output #> q.path
          FROM eec_step_result s
         WHERE q.source IS NOT NULL AND s.run_id = q.run_id AND s.node_id = q.source
           AND s.outcome = 'succeeded'
         ORDER BY s.attempt DESC
         LIMIT 1)) AS v
"""


def wanted(run: LoadedRun) -> list[dict[str, Any]]:
    """The selectors to read for ``run``: those of its sleep steps with ``until`` whose node
    has not started (a live run's only)."""
    if not run.wf.selects or run.state.status.terminal:
        return []
    nodes = run.state.node_map()
    queries = []
    for step in run.wf.selects:
        assert step.until is not None
        if nodes[step.name].status is NodeStatus.PENDING:
            until = step.until
            queries.append(
                {"run_id": run.run_id, "step": step.name, "source": until.step, "path": until.path}
            )
    return queries


def read_selected(
    conn: psycopg.Connection[Any], queries: list[dict[str, Any]]
) -> Mapping[str, tuple[tuple[str, Selected], ...]]:
    """What each query found, by run: (step, Selected) for each whose source is recorded."""
    found = conn.execute(_SELECTED_SQL, (orjson.dumps(queries).decode(),)).fetchone()
    assert found is not None
    by_run: dict[str, list[tuple[str, Selected]]] = {}
    for run_id, step, recorded, value in orjson.loads(found[0]):
        if recorded:
            selected = Selected(False) if value is None else Selected(True, value[0])
            by_run.setdefault(run_id, []).append((step, selected))
    return {run_id: tuple(pairs) for run_id, pairs in by_run.items()}
