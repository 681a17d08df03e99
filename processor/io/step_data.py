"""The worker's statements: the read of what its steps need and their tasks do not carry (the
run's input and the outputs of the steps' dependencies; core/step_task.py says when a task
carries them), and the write of each attempt's result.

One statement for a whole batch of tasks, on the worker's own connection. A task names its
dependencies and the attempts of theirs that succeeded (``dep_attempts``): primary-key reads.
A task from a coordinator older than data flow names nothing; its dependencies are then read
from the run's definition and their attempts from the run's node states (a succeeded node
stays succeeded, so the attempt read is the one the coordinator applied).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

import orjson
import psycopg

from processor.core.model import StepOutcome
from processor.core.step_task import StepData, StepTask

_FETCH_SQL = """
SELECT t.i, r.input,
       (SELECT jsonb_object_agg(s.node_id, s.output)
          FROM jsonb_each_text(coalesce(t.deps, (
                   SELECT jsonb_object_agg(dep, r.node_states -> dep -> 'attempt')
                     FROM eec_workflow_definition w
                    CROSS JOIN jsonb_array_elements(w.definition -> 'steps') AS st
                    CROSS JOIN jsonb_array_elements_text(st -> 'depends_on') AS dep
                    WHERE w.name = r.workflow_name AND w.version = r.workflow_version
                      AND st ->> 'name' = t.node))) AS d(node, attempt)
          JOIN eec_step_result s
            ON s.run_id = r.run_id AND s.node_id = d.node AND s.attempt = d.attempt::int)
  FROM jsonb_to_recordset(%s::jsonb) AS t(i int, run_id text, node text, deps jsonb)
  JOIN eec_workflow_run r ON r.run_id = t.run_id
"""


class MissingData(LookupError):
    """What a task's step needs is not in the database; the message says what."""


def fetch_step_data(
    conn: psycopg.Connection[Any], tasks: Sequence[StepTask]
) -> list[StepData | MissingData]:
    """The data of each task, in order: the run's input and its dependencies' outputs, or
    what is missing (the run was deleted, a dependency's output is not recorded)."""
    if not tasks:
        return []
    wanted = orjson.dumps(
        [
            {
                "i": i,
                "run_id": t.run_id,
                "node": t.node,
                "deps": None if t.dep_attempts is None else dict(t.dep_attempts),
            }
            for i, t in enumerate(tasks)
        ]
    ).decode()
    found = {
        i: (run_input, outputs) for i, run_input, outputs in conn.execute(_FETCH_SQL, (wanted,))
    }
    data: list[StepData | MissingData] = []
    for i, task in enumerate(tasks):
        if i not in found:
            data.append(MissingData(f"run {task.run_id!r} no longer exists"))
            continue
        run_input, outputs = found[i]
        outputs = outputs or {}
        missing = [d for d, _ in task.dep_attempts or () if d not in outputs]
        if missing:
            attempts = dict(task.dep_attempts or ())
            data.append(
                MissingData(
                    "no recorded output for "
                    + ", ".join(f"{d!r} attempt {attempts[d]}" for d in missing)
                )
            )
            continue
        data.append(StepData(run_input, MappingProxyType(outputs)))
    return data


class StepResultRow(NamedTuple):
    """A result as the worker records it."""

    run_id: str
    node: str
    attempt: int
    outcome: StepOutcome
    output: Any
    error: str | None
    retryable: bool = True  # False: the step declared the failure final (NonRetryable)


_INSERT_RESULTS_SQL = """
INSERT INTO eec_step_result (run_id, node_id, attempt, outcome, output, error, retryable)
SELECT r.run_id, r.node_id, r.attempt, r.outcome, coalesce(r.output, 'null'::jsonb), r.error,
       coalesce(r.retryable, true)
  FROM jsonb_to_recordset(%s::jsonb)
       AS r(run_id text, node_id text, attempt int, outcome text, output jsonb, error text,
            retryable boolean)
 ORDER BY r.run_id, r.node_id, r.attempt
    ON CONFLICT DO NOTHING
"""


def insert_step_results(conn: psycopg.Connection[Any], results: Sequence[StepResultRow]) -> None:
    """Record results in one statement (a redelivered one is ignored; an output of None is
    stored as JSON null). A result the database refuses fails the whole statement, and nothing
    of it is written: the caller then records the results one by one, to learn which."""
    rows = [
        {"run_id": r, "node_id": n, "attempt": a, "outcome": o, "output": out, "error": e}
        | ({} if retryable else {"retryable": False})
        for r, n, a, o, out, e, retryable in results
    ]
    conn.execute(_INSERT_RESULTS_SQL, (orjson.dumps(rows).decode(),))
