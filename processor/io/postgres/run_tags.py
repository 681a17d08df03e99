"""A run's tags as every reader sees them: those given at its start (the run row's ``tags``)
with those its steps set (``eec_run_tag``, schemas/migrations/0045_run_tags.sql), a step's
value replacing the start's for the same key; and the condition that finds runs by them.
Shared by the listings (io/postgres/run_search.py) and a look at one run
(io/postgres/runs_admin.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson


def merged_tags(run: str) -> str:
    """The tags of the run aliased ``run``, as one JSON object (an SQL expression)."""
    return (
        f"({run}.tags || coalesce((SELECT jsonb_object_agg(t.key, t.value) FROM eec_run_tag t"
        f" WHERE t.run_id = {run}.run_id), '{{}}'::jsonb))"
    )


def tags_condition(run: str, wanted: Sequence[tuple[str, str]]) -> tuple[str, dict[str, Any]]:
    """The runs aliased ``run`` whose tags hold every pair of ``wanted`` (an SQL condition),
    and its parameters. A run holds them all only if its start's tags do, or its steps set
    one of them: the first part says so through the indexes (the partial index of the
    start's tags, migration 0017; the lookup by key and value of those the steps set, 0045,
    read once, into an array the primary key finds), the second decides exactly, on the rows
    the first let through."""
    params: dict[str, Any] = {"tags": orjson.dumps(dict(wanted)).decode()}
    pairs = []
    for i, (key, value) in enumerate(wanted):
        params[f"tag_key_{i}"], params[f"tag_value_{i}"] = key, value
        pairs.append(f"s.key = %(tag_key_{i})s AND s.value = %(tag_value_{i})s")
    set_by_steps = f"SELECT s.run_id FROM eec_run_tag s WHERE {' OR '.join(pairs)}"
    condition = (
        f"({run}.tags @> %(tags)s::jsonb AND {run}.tags <> '{{}}'::jsonb"
        f" OR {run}.run_id = ANY (ARRAY({set_by_steps})))"
        f" AND {merged_tags(run)} @> %(tags)s::jsonb"
    )
    return condition, params
