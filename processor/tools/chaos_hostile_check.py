"""What became of the chaos run's hostile records and of its map run
(processor/tools/chaos_hostile.py): each record refused once with its reason, nothing it
asked for done, the map run succeeded with every item's output."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from processor.io.kafka.dlq import DeadLetter
from processor.tools import audit, chaos_steps
from processor.tools.chaos_hostile import HEADER, HostileProducer


@dataclass
class HostileMapFigures:
    """The map run as it ended."""

    items: int
    status: str | None = None
    outputs: int | None = None
    writes: int | None = None  # audited committed writes (None: the audit failed)
    unversioned: int = 0
    timeouts: int = 0
    attempts_run: int = 0
    extra_executions: int = 0

    def row(self) -> str:
        if not self.items:
            return "none"
        outputs = "no" if self.outputs is None else str(self.outputs)
        return (
            f"{self.items} items: {self.status or 'NOT FOUND'} with {outputs} outputs;"
            f" {self.writes} committed writes checked, {self.unversioned} unversioned;"
            f" {self.attempts_run} attempts ran, {self.extra_executions} executions beyond one"
            f" per attempt; {self.timeouts} attempts timed out"
        )


@dataclass
class HostileVerdict:
    """What became of the hostile records and the map run; ``problems`` says what failed."""

    written: Counter[str]  # acknowledged hostile records, by the reason each must get
    refused: Counter[str]  # their dead letters (one per source position), by reason
    kinds: int
    failed_deliveries: int
    copies: int  # dead letters of hostile records sent again after a kill (folded)
    signals_on_chaos_runs: int
    map_run: HostileMapFigures
    exits: int
    problems: list[str] = field(default_factory=list)
    # The dead letters accounted for, by their place in the dead-letter topic.
    letters: set[tuple[int, int]] = field(default_factory=set)

    def rows(self) -> list[tuple[str, str]]:
        written, refused = sum(self.written.values()), sum(self.refused.values())
        return [
            (
                "hostile",
                f"{written} records of {self.kinds} kinds written to the requests topic through"
                f" the faults ({_counts(self.written)}); {refused} dead letters by source"
                f" position, by reason as written ({self.copies} copies sent again after a"
                f" kill, folded); {self.failed_deliveries} deliveries failed and written again;"
                f" {self.exits} process exits",
            ),
            (
                "forged",
                f"{self.signals_on_chaos_runs} signals recorded on the chaos runs, none kept;"
                " the map run took only its own approval",
            ),
            ("map run", self.map_run.row()),
        ]


def check_hostile(
    conn: psycopg.Connection[Any],
    producer: HostileProducer,
    letters: Sequence[DeadLetter],
    run_ids: Sequence[str],
    exits: int,
) -> HostileVerdict:
    """Each hostile record refused once, with its reason; nothing a hostile record asked for
    done; the map run succeeded with every item's output."""
    by_id = _letters_by_id(producer, letters)
    verdict = HostileVerdict(
        written=Counter(k.reason.value for k in producer.acknowledged.values()),
        refused=Counter(),
        kinds=len({k.name for k in producer.acknowledged.values()}),
        failed_deliveries=len(producer.failed),
        copies=sum(letter.copies - 1 for found in by_id.values() for letter in found),
        signals_on_chaos_runs=0,
        map_run=HostileMapFigures(producer.plan.map_items),
        exits=exits,
    )
    _check_refusals(producer, by_id, verdict)
    _check_nothing_done(conn, producer, run_ids, verdict)
    if producer.plan.map_items:
        _check_map(conn, producer.map_id, verdict.map_run, verdict.problems)
    return verdict


def _letters_by_id(
    producer: HostileProducer, letters: Sequence[DeadLetter]
) -> dict[str, list[DeadLetter]]:
    """The dead letters of the requests topic's hostile records, by the id in their header."""
    by_id: dict[str, list[DeadLetter]] = defaultdict(list)
    for letter in letters:
        hostile_id = letter.header(HEADER)
        if hostile_id is not None and letter.source_topic == producer.topic:
            by_id[hostile_id].append(letter)
    return by_id


def _check_refusals(
    producer: HostileProducer, by_id: dict[str, list[DeadLetter]], verdict: HostileVerdict
) -> None:
    """Each record written refused once, for its kind's reason."""
    problems = verdict.problems
    for hostile_id, kind in sorted(producer.sent.items()):
        found = by_id.get(hostile_id, [])
        verdict.letters.update((letter.partition, letter.offset) for letter in found)
        if hostile_id in producer.acknowledged:
            verdict.refused.update(letter.reason for letter in found)
            if len(found) != 1:
                problems.append(f"hostile record {hostile_id!r}: {len(found)} dead letters")
        elif len(found) > 1:  # delivery failed: it may have reached the topic, once
            problems.append(f"hostile record {hostile_id!r} (not delivered): {len(found)}")
        for letter in found:
            if letter.reason != kind.reason.value:
                problems.append(
                    f"hostile record {hostile_id!r} refused as {letter.reason}, not as"
                    f" {kind.reason.value}: {letter.detail}"
                )
    unknown = sorted(set(by_id) - set(producer.sent))
    if unknown:
        problems.append(f"dead letters naming hostile records never written: {unknown[:5]}")
    if producer.error is not None:
        problems.append(f"the hostile producer failed: {producer.error!r}")


def _check_nothing_done(
    conn: psycopg.Connection[Any],
    producer: HostileProducer,
    run_ids: Sequence[str],
    verdict: HostileVerdict,
) -> None:
    """No signal recorded or kept for a chaos run, no run a hostile start made."""
    problems, topic_prefix = verdict.problems, producer.topic_prefix
    verdict.signals_on_chaos_runs = _count(conn, _SIGNALLED, f"{topic_prefix}-")
    if verdict.signals_on_chaos_runs:
        problems.append(f"{verdict.signals_on_chaos_runs} signals recorded on chaos runs")
    kept = _count(conn, _KEPT, topic_prefix)
    if kept:
        problems.append(f"{kept} signals kept for run ids of the chaos run")
    made = _count(conn, _MADE, topic_prefix, list(run_ids), producer.map_id)
    taken = _count(conn, _TAKEN, list(run_ids))
    if made or taken:
        problems.append(
            f"runs a hostile start made: {made}; chaos runs of another workflow: {taken}"
        )


_SIGNALLED = "SELECT count(*) FROM eec_run_signal WHERE starts_with(run_id, %s)"
_KEPT = "SELECT count(*) FROM eec_kept_signal WHERE starts_with(run_id, %s)"
# Runs of the chaos run's topic prefix that neither the feeder nor the map's start made.
_MADE = (
    "SELECT count(*) FROM eec_workflow_run WHERE starts_with(run_id, %s)"
    " AND NOT run_id = ANY(%s) AND run_id <> %s"
)
_TAKEN = (
    "SELECT count(*) FROM eec_workflow_run"
    " WHERE run_id = ANY(%s) AND workflow_name <> 'chaos-sample'"
)


def _check_map(
    conn: psycopg.Connection[Any], map_id: str, figures: HostileMapFigures, problems: list[str]
) -> None:
    row = conn.execute(
        "SELECT status, CASE WHEN jsonb_typeof(output) = 'array'"
        " THEN jsonb_array_length(output) END FROM eec_workflow_run WHERE run_id = %s",
        (map_id,),
    ).fetchone()
    if row is not None:
        figures.status, figures.outputs = row[0], row[1]
    if figures.status != "succeeded" or figures.outputs != figures.items:
        problems.append(
            f"the map run {map_id} is {figures.status or 'missing'} with {figures.outputs}"
            f" outputs, not succeeded with {figures.items}"
        )
    try:
        figures.writes = audit.assert_transitions_applied_once(conn, map_id)
    except audit.AuditFailure as exc:
        problems.append(f"audit of the map run: {exc}")
    unversioned = audit.unversioned_writes(conn, map_id)
    figures.unversioned = sum(unversioned.values())
    if unversioned:
        problems.append(f"writes to the map run that did not move its version: {unversioned}")
    timeouts = audit.timed_out_attempts(conn, map_id)
    figures.timeouts = len(timeouts)
    reached = chaos_steps.reached_a_worker(conn, map_id)
    lost = [
        t
        for t in timeouts
        if chaos_steps.never_ran((t.run_id, t.node, t.attempt), t.result_at is not None, reached)
    ]
    if lost:
        problems.append(
            f"{len(lost)} map items timed out and never reached a worker:"
            f" {lost[0].node} #{lost[0].attempt}"
        )
    signals = conn.execute("SELECT signal_id FROM eec_run_signal WHERE run_id = %s", (map_id,))
    found = [r[0] for r in signals]
    if found != [f"{map_id}:approval"]:
        problems.append(f"the map run's signals are {found}, not its own approval alone")
    executions = chaos_steps.executions(conn, map_id)
    figures.attempts_run = len(executions)
    figures.extra_executions = chaos_steps.extra_executions(executions)


def _count(conn: psycopg.Connection[Any], sql: str, *params: Any) -> int:
    row = conn.execute(sql, params).fetchone()
    return int(row[0]) if row else 0


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{k} {n}" for k, n in counter.most_common()) or "none"
