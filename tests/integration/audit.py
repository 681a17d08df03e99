"""Checks over the audit trail of run-row writes (see the `audit` fixture)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import psycopg


def assert_transitions_applied_once(pg: psycopg.Connection[Any]) -> int:
    """Every committed write moved its run by exactly one version and one seq, no version was
    written twice, each attempt of each node was dispatched once and resolved at most once.

    Returns how many writes were checked.
    """
    rows = pg.execute(
        "SELECT run_id, old_version, new_version, old_seq, new_seq, old_nodes, new_nodes"
        " FROM test_run_audit ORDER BY id"
    ).fetchall()
    from_versions: Counter[tuple[str, int]] = Counter()
    dispatched: Counter[tuple[str, str, int]] = Counter()
    resolved: Counter[tuple[str, str, int]] = Counter()
    for run_id, old_v, new_v, old_seq, new_seq, old_nodes, new_nodes in rows:
        assert new_v == old_v + 1, f"{run_id}: version jumped {old_v} -> {new_v}"
        assert new_seq == old_seq + 1, f"{run_id}: seq moved {old_seq} -> {new_seq}"
        from_versions[(run_id, old_v)] += 1
        for node, new in new_nodes.items():
            old = old_nodes.get(node, {"status": "pending", "attempt": 0})
            if new["status"] == "dispatched" and (old["status"], old["attempt"]) != (
                "dispatched",
                new["attempt"],
            ):
                dispatched[(run_id, node, new["attempt"])] += 1
            if old["status"] == "dispatched" and (new["status"], new["attempt"]) != (
                "dispatched",
                old["attempt"],
            ):
                resolved[(run_id, node, old["attempt"])] += 1
    twice = [k for k, n in from_versions.items() if n > 1]
    assert not twice, f"versions written twice: {twice[:5]}"
    redispatched = [k for k, n in dispatched.items() if n > 1]
    assert not redispatched, f"attempts dispatched twice: {redispatched[:5]}"
    reapplied = [k for k, n in resolved.items() if n > 1]
    assert not reapplied, f"attempt outcomes applied twice: {reapplied[:5]}"
    return len(rows)


def assert_results_applied(pg: psycopg.Connection[Any], run_ids: list[str]) -> None:
    """Each succeeded node's final attempt has a recorded success, and no later attempt ran."""
    rows = pg.execute(
        """
        SELECT r.run_id, n.key, (n.value->>'attempt')::int,
               (SELECT max(s.attempt) FROM eec_step_result s
                 WHERE s.run_id = r.run_id AND s.node_id = n.key),
               (SELECT s.outcome FROM eec_step_result s
                 WHERE s.run_id = r.run_id AND s.node_id = n.key
                   AND s.attempt = (n.value->>'attempt')::int)
          FROM eec_workflow_run r, jsonb_each(r.node_states) n
         WHERE r.run_id = ANY(%s) AND r.status = 'succeeded'
        """,
        (run_ids,),
    ).fetchall()
    for run_id, node, attempt, max_recorded, outcome in rows:
        assert outcome == "succeeded", f"{run_id}/{node}: attempt {attempt} has result {outcome}"
        assert max_recorded == attempt, (
            f"{run_id}/{node}: results up to {max_recorded}, node at {attempt}"
        )
