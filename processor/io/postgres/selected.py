"""What the selectors of steps not yet started find (core/selectors.py): a sleep's ``until``
(core/sleeps.py), a condition's (core/conditions.py, core/skips.py). Read with the batch's
load (io/postgres/store.py) for the runs that have such a step about to be judged, and only
for them: a run of a workflow without such steps costs nothing more (``WorkflowDef.selects``
is empty: no statement, no loop), and a batch with some costs one statement, which returns
the selected values alone (``#>``), never a whole input or output.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import psycopg

from processor.core.model import LoadedRun
from processor.core.run_state import NodeStatus
from processor.core.selectors import Selected

# For each (run, key, source, path): whether the source is recorded (the run's input always
# is; a step's output once its success is), and what the path finds in it, as [value] (a JSON
# null found is [null]) or null when nothing is there.
_SELECTED_SQL = """
SELECT coalesce(json_agg(json_build_array(q.run_id, q.key, v.recorded,
                                          CASE WHEN v.value IS NOT NULL
                                               THEN jsonb_build_array(v.value) END)), '[]')::text
  FROM jsonb_to_recordset(%s::jsonb) AS q(run_id text, key text, source text, path text[])
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
    """The selectors to read for ``run`` (a live run's only), each once: those of its steps
    that read values before they start whose node is pending and whose dependencies each
    ended or are in flight (any other cannot end in this tick, so the step cannot start in
    it; should one start and end in it nonetheless, the tick holds the step for the next
    load: core/skips.py). A selector of a step skipped is not read: its output is absent."""
    if not run.wf.selects or run.state.status.terminal:
        return []
    nodes = run.state.node_map()
    queries: dict[str, dict[str, Any]] = {}
    for step in run.wf.selects:
        if nodes[step.name].status is not _PENDING:
            continue
        if not all(nodes[d].status in _MAY_HAVE_ENDED for d in step.depends_on):
            continue
        for selector in step.selectors:
            if selector.text in queries:
                continue
            if selector.step is not None and nodes[selector.step].status is _SKIPPED:
                continue
            queries[selector.text] = {
                "run_id": run.run_id,
                "key": selector.text,
                "source": selector.step,
                "path": selector.path,
            }
    return list(queries.values())


def read_selected(
    conn: psycopg.Connection[Any], queries: list[dict[str, Any]]
) -> Mapping[str, tuple[tuple[str, Selected], ...]]:
    """What each query found, by run: (selector's text, Selected) for each whose source is
    recorded."""
    found = conn.execute(_SELECTED_SQL, (orjson.dumps(queries).decode(),)).fetchone()
    assert found is not None
    by_run: dict[str, list[tuple[str, Selected]]] = {}
    for run_id, key, recorded, value in orjson.loads(found[0]):
        if recorded:
            selected = Selected(False) if value is None else Selected(True, value[0])
            by_run.setdefault(run_id, []).append((key, selected))
    return {run_id: tuple(pairs) for run_id, pairs in by_run.items()}


_PENDING, _SKIPPED = NodeStatus.PENDING, NodeStatus.SKIPPED
# What a dependency is in when it has ended, or may end in the tick of this load.
_MAY_HAVE_ENDED = frozenset({NodeStatus.SUCCEEDED, _SKIPPED, NodeStatus.DISPATCHED})
