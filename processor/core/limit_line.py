"""The order of a limit's line of waiters: round-robin across the keys its waiters' runs carry
(docs/usage.md#limits). Pure: the rule the shell's statements follow
(io/postgres/limit_store.py: a waiter's round is written as it joins, the line read in
order), stated here as functions the property tests hold those statements to.

Each waiter carries its run's key (``run_key``: the value its workflow's ``concurrency``
counts it by, core/run_keys.py; '' for a run of a workflow without one) and a round, fixed
as it joins the line (``join_round``): the round of the line's first waiter, or the round
after its own key's last waiter, whichever is later. The line is ordered by round, then by
age (``since``, then run id and node). So:

- within a key, first come, first served (each joins after its key's last);
- across keys, by turns: a key with 500 runs waiting has them in 500 rounds, and another
  key's waiter joins in the round being served, so it is let in after at most one waiter of
  each key ahead of it in that round, not after the 500;
- a line whose waiters all carry one key (every step limit of a workflow without
  ``concurrency``, and a workflow's own line per key) is first come, first served;
- nobody starves: a waiter never joins ahead of the line's first (its round is no earlier,
  and it is younger), so no waiter's place grows while it waits: once every waiter ahead of
  it is in, it is.

A newcomer (a dispatch or a start that finds no room) waits behind every waiter already in
line in this batch (core/limits.py, rule 2) and joins the line in its round.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

__all__ = ["Waiter", "join_round", "line_order"]


class Waiter(NamedTuple):
    since_ms: int
    run_id: str
    node: str
    run_key: str = ""
    round: int = 0


def line_order(waiters: Iterable[Waiter]) -> list[Waiter]:
    """The waiters in the order the line lets them in."""
    return sorted(waiters, key=lambda w: (w.round, w.since_ms, w.run_id, w.node))


def join_round(line: Sequence[Waiter], run_key: str) -> int:
    """The round a waiter of ``run_key`` joins ``line`` in."""
    first = min((w.round for w in line), default=0)
    after_own = max((w.round + 1 for w in line if w.run_key == run_key), default=0)
    return max(first, after_own)
