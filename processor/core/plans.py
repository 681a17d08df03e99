"""The shapes of the commit path's decisions (core/decide.py makes them, the shell carries
them out): the records to produce (``Send``), a run's share of a batched commit (``Commit``),
a force-fail's terminal write, a run's work as the batch sees it, and the ``Plan`` of each
run: a record (which run, what became of it, what its tick's try came to) carrying one payload
per kind of outcome, each with exactly what that outcome needs:

- ``Produce``: the work settles once its records (maybe none) are acknowledged (committed,
  noop, hopped; a request accepted or a duplicate);
- ``TryAgain``: nothing settles; the work waits ``retry_in_ms`` for another try (conflict,
  locked, error);
- ``Requeue``: its conflict tries used up, the work goes to the delay ladder;
- ``ForceFailed``: a livelocked run's terminal write, then its records;
- ``DeadLettered``: every record to the dead-letter topic, with why (and the run quarantined
  when its row cannot be used).

The shell dispatches on the payload's type (engine/executor.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from processor.core.children import ChildStart
from processor.core.dataflow import OutputRefs
from processor.core.envelope import Wakeup
from processor.core.limit_values import RunLimits
from processor.core.outcomes import DeadLetterReason, ForceFailReason, Outcome
from processor.core.records import Inbound
from processor.core.routing import TopicNames
from processor.core.run_state import RunState
from processor.core.shapes import AttemptRef

Attributes = tuple[tuple[str, str | int], ...]


@dataclass(frozen=True, slots=True)
class Send:
    """One record to produce. ``by_run``: on the partition of that run's wakeups (the shell
    knows the partition counts); None: wherever the client's partitioner puts the key."""

    topic: str
    key: bytes | None
    value: bytes | None
    by_run: str | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    attributes: Attributes = ()  # for the record's PRODUCER span

    # Written out (as for Commit, Plan and BatchItem): the compiled build compiles it, where
    # the dataclass decorator's own is interpreted Python, ~20 x dearer, and each tick builds
    # several. tests/unit/test_dataclass_inits.py holds each to its fields.
    def __init__(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        by_run: str | None = None,
        headers: tuple[tuple[str, bytes], ...] = (),
        attributes: Attributes = (),
    ) -> None:
        object.__setattr__(self, "topic", topic)
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "by_run", by_run)
        object.__setattr__(self, "headers", headers)
        object.__setattr__(self, "attributes", attributes)


@dataclass(frozen=True, slots=True)
class Commit:
    """One run's share of a batched commit: its new state, the version it was computed from,
    and the records the transition must produce (written to the outbox with it)."""

    run_id: str
    expected_version: int
    state: RunState
    effects: tuple[Send, ...] = ()
    # Set only on the commit that ends a run succeeded whose workflow declares an output: the
    # step results the statement reads it from (dataflow.py).
    output: OutputRefs | None = None
    # Wait steps the transition ended, (node, attempt, signal id): the statement records each
    # as the step's result, the signal's payload its output.
    signalled: tuple[tuple[str, int, str], ...] = ()
    # Child runs the transition starts (the statement writes their rows), and those it
    # cancels (a cancel signal each): core/children.py.
    children: tuple[ChildStart, ...] = ()
    cancel_children: tuple[str, ...] = ()
    # Map steps the transition ended, (node, attempt, how many items): the statement records
    # each one's output, its items' outputs in order (core/tick.py, rule 6).
    mapped: tuple[tuple[str, int, int], ...] = ()
    # What the commit writes of the run's limits (core/limits.py); None: nothing.
    limits: RunLimits | None = None
    # Map items the transition took out of the state, succeeded: (map step, index, attempt),
    # which the statement records (eec_map_item) for the map's output.
    items: tuple[tuple[str, int, int], ...] = ()
    # Attempts the transition fails that no worker started, (node, attempt): the statement
    # marks each never to be started, and writes the run only if it could, that is, only if
    # no worker claimed one meanwhile (io/postgres/store.py); else the run lost a race, a conflict.
    unstarted: tuple[AttemptRef, ...] = ()
    # Steps the transition ended with an output the tick made, (node, attempt, output as
    # JSON text): a sleep's, a wait's default (core/tick.py); the statement records each.
    settled: tuple[tuple[str, int, str], ...] = ()

    def __init__(
        self,
        run_id: str,
        expected_version: int,
        state: RunState,
        effects: tuple[Send, ...] = (),
        output: OutputRefs | None = None,
        signalled: tuple[tuple[str, int, str], ...] = (),
        children: tuple[ChildStart, ...] = (),
        cancel_children: tuple[str, ...] = (),
        mapped: tuple[tuple[str, int, int], ...] = (),
        limits: RunLimits | None = None,
        items: tuple[tuple[str, int, int], ...] = (),
        unstarted: tuple[AttemptRef, ...] = (),
        settled: tuple[tuple[str, int, str], ...] = (),
    ) -> None:
        object.__setattr__(self, "run_id", run_id)
        object.__setattr__(self, "expected_version", expected_version)
        object.__setattr__(self, "state", state)
        object.__setattr__(self, "effects", effects)
        object.__setattr__(self, "output", output)
        object.__setattr__(self, "signalled", signalled)
        object.__setattr__(self, "children", children)
        object.__setattr__(self, "cancel_children", cancel_children)
        object.__setattr__(self, "mapped", mapped)
        object.__setattr__(self, "limits", limits)
        object.__setattr__(self, "items", items)
        object.__setattr__(self, "unstarted", unstarted)
        object.__setattr__(self, "settled", settled)


@dataclass(frozen=True, slots=True)
class ForceFailWrite:
    """The terminal write a plan needs before it holds: conditioned on the loaded checksum,
    so it applies only if the run did not move since it was loaded. The same statement
    cancels ``cancel_children`` (a cancel signal each) and keeps ``effects`` in the outbox
    (their wakeups, and its parent's for a child): core/children.py, rule 4."""

    run_id: str
    loaded_checksum: str
    state: RunState
    cancel_children: tuple[str, ...] = ()
    effects: tuple[Send, ...] = ()


# -- the payloads of a plan: one per kind of outcome ----------------------------------------


@dataclass(frozen=True, slots=True)
class Produce:
    """Settles once every record in ``sends`` is acknowledged (none: at once)."""

    sends: tuple[Send, ...] = ()
    outboxed_seq: int | None = None  # committed with an outbox row: delete it once all acked

    def __init__(self, sends: tuple[Send, ...] = (), outboxed_seq: int | None = None) -> None:
        object.__setattr__(self, "sends", sends)
        object.__setattr__(self, "outboxed_seq", outboxed_seq)


@dataclass(frozen=True, slots=True)
class TryAgain:
    """Nothing settles: the work is tried again after ``retry_in_ms``, with ``tries``
    in-process tries from now on."""

    retry_in_ms: int
    tries: int = 0

    def __init__(self, retry_in_ms: int, tries: int = 0) -> None:
        object.__setattr__(self, "retry_in_ms", retry_in_ms)
        object.__setattr__(self, "tries", tries)


@dataclass(frozen=True, slots=True)
class Requeue:
    """Its in-process tries used up: the work's wakeup goes to the delay ladder, the new
    envelope counting ``requeue_count``, on the ``rung_ms`` rung."""

    send: Send
    requeue_count: int
    rung_ms: int


@dataclass(frozen=True, slots=True)
class ForceFailed:
    """The livelock guard's terminal ``write``, made before the plan holds; its records are
    produced once it landed, and its outbox row deleted once they are in."""

    reason: ForceFailReason
    write: ForceFailWrite

    @property
    def outboxed_seq(self) -> int | None:
        return self.write.state.seq if self.write.effects else None


@dataclass(frozen=True, slots=True)
class DeadLettered:
    """Every record of the work to the dead-letter topic, with why. ``quarantine``: the run's
    row cannot be used (dead-lettered for what it holds): flag it, so the sweeps stop waking
    it; written before the plan is carried out, like a force-fail."""

    reason: DeadLetterReason
    detail: str
    sends: tuple[Send, ...]
    quarantine: bool = False

    def __init__(
        self,
        reason: DeadLetterReason,
        detail: str,
        sends: tuple[Send, ...],
        quarantine: bool = False,
    ) -> None:
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "detail", detail)
        object.__setattr__(self, "sends", sends)
        object.__setattr__(self, "quarantine", quarantine)


Payload = Produce | TryAgain | Requeue | ForceFailed | DeadLettered

NOTHING = Produce()  # a plan that settles at once, producing nothing (a no-op)


@dataclass(frozen=True, slots=True)
class Plan:
    """What the shell does with one run's work: ``outcome`` is what becomes of it,
    ``payload`` what that takes (one type per kind of outcome, above). ``tick_outcome`` is the
    outcome of the tick's try itself (committed, noop, conflict or locked; None when
    nothing was ticked); ``expected_version`` the version the try loaded."""

    run_id: str
    outcome: Outcome
    payload: Payload = NOTHING
    tick_outcome: Outcome | None = None
    expected_version: int | None = None

    def __init__(
        self,
        run_id: str,
        outcome: Outcome,
        payload: Payload = NOTHING,
        tick_outcome: Outcome | None = None,
        expected_version: int | None = None,
    ) -> None:
        object.__setattr__(self, "run_id", run_id)
        object.__setattr__(self, "outcome", outcome)
        object.__setattr__(self, "payload", payload)
        object.__setattr__(self, "tick_outcome", tick_outcome)
        object.__setattr__(self, "expected_version", expected_version)

    @property
    def sends(self) -> tuple[Send, ...]:
        """The records the plan produces (none for a retry)."""
        p = self.payload
        if isinstance(p, (Produce, DeadLettered)):
            return p.sends
        if isinstance(p, Requeue):
            return (p.send,)
        if isinstance(p, ForceFailed):
            return p.write.effects
        return ()

    @property
    def settles(self) -> bool:
        return not isinstance(self.payload, TryAgain)

    @property
    def quarantine(self) -> bool:
        """Whether the run's row is to be flagged before the plan holds."""
        return isinstance(self.payload, DeadLettered) and self.payload.quarantine


P = TypeVar("P", Produce, TryAgain, Requeue, ForceFailed, DeadLettered)


def payload_of(plan: Plan, kind: type[P]) -> P:
    """The plan's payload, known to be a ``kind`` (a test's or an assertion's reading)."""
    payload = plan.payload
    assert isinstance(payload, kind), f"{plan.outcome}: {payload!r} is no {kind.__name__}"
    return payload


@dataclass(frozen=True, slots=True)
class BatchItem:
    """A run's work as the commit path sees it (a snapshot: the database thread reads it)."""

    run_id: str
    tries: int
    records: tuple[Inbound, ...]
    locked: int = 0  # commits in a row that found its row held by another transaction
    prior_version: int | None = None  # the version its previous try loaded

    def __init__(
        self,
        run_id: str,
        tries: int,
        records: tuple[Inbound, ...],
        locked: int = 0,
        prior_version: int | None = None,
    ) -> None:
        object.__setattr__(self, "run_id", run_id)
        object.__setattr__(self, "tries", tries)
        object.__setattr__(self, "records", records)
        object.__setattr__(self, "locked", locked)
        object.__setattr__(self, "prior_version", prior_version)

    def lineage(self) -> Wakeup:
        """The envelope whose requeue history this work continues: the most requeued one."""
        wakeups = [r.wakeup for r in self.records if r.wakeup is not None]
        return max(wakeups, key=lambda w: (w.requeue_count, w.requeue_seq))


@dataclass(frozen=True, slots=True)
class Rules:
    """What the decisions depend on besides their inputs (fixed at start)."""

    names: TopicNames
    livelock_requeues: int
    # The largest dead letter the producer and the dead-letter topic both take (key, value and
    # headers); a larger record is dead-lettered truncated, with its size in a header.
    dlq_max_bytes: int = 1_000_000


__all__ = [
    "NOTHING",
    "Attributes",
    "BatchItem",
    "Commit",
    "DeadLettered",
    "ForceFailWrite",
    "ForceFailed",
    "Payload",
    "Plan",
    "Produce",
    "Requeue",
    "Rules",
    "Send",
    "TryAgain",
    "payload_of",
]
