"""The watchdog: re-wakes runs whose next wakeup is overdue, force-fails stuck runs, relays
the outbox rows a dead instance left behind, and marks parked the rows whose record the
broker refuses for good (the executor finds them: io/kafka/delivery.py).

Sweeps are split across the live instances without a lock or a lease: a run belongs to the
wakeup partition its id hashes to (the same partition its wakeups go to), and an instance only
sweeps the runs of the bulk-tier (t2) partitions the consumer group assigned to it. The group
protocol already guarantees one owner per partition; a brief overlap during a rebalance only
produces a duplicate wakeup, which a no-op tick absorbs.

Schedules (io/postgres/schedules.py) are fired by shard too: the runs of their due fires are started
and woken.

The concurrency slots of executions that outlived their attempts (a step in a thread after a
timeout or a cancel: core/limits.py, rule 4) are freed once their executions are over, and
their waiters woken, by any instance that sweeps and may judge who is gone (a slot another
instance's sweep is freeing is passed over).

Signals kept for runs that did not exist yet (io/postgres/kept_signals.py) are swept by shard too:
those whose run now exists are applied and their runs woken, those whose run never came (a cancel
excepted: it waits for its start however long) are claimed for their dead letters, deleted
once the broker has them.

The relay is not split: every live instance claims rows left behind, whether it owns
partitions or not; it takes only rows whose owner is gone from the instance registry
(io/postgres/instances.py), never those a live instance's producer still holds. After a crash the
dead instance's partitions stay with it until the group's session timeout (10 s on the local
broker, 45 s by Kafka's default); when every instance crashed, the new ones own nothing for
that long, and a relay that waited for partitions would let the dead instances' step tasks
wait past their deadlines.

A sweep never stops on one item: an exception nobody foresaw while settling one stuck run or
firing one schedule is logged and counted (``ductor.isolated{ductor.stage="sweep"}``) and the
sweep goes on with the next; one met by a whole part of the sweep (the overdue runs, the kept
signals, the relay, the triggers) leaves that part for the next sweep and goes on with the
others. Only the database's own errors end a sweep (an outage, reported as one).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import psycopg

from processor.core.plans import Send
from processor.core.routing import TopicNames
from processor.core.shapes import RunRef
from processor.core.stuck import Fail, Leave, StuckVerdict, Wake
from processor.engine.database import Database
from processor.engine.recent_commits import RecentCommits
from processor.io.postgres.db_errors import TRANSIENT, classify
from processor.io.postgres.kept_signals import KeptDeadLetter, KeptKey
from processor.io.postgres.outbox import OutboxRelay
from processor.io.postgres.trigger_store import TriggerSet
from processor.io.runtime.faults import NO_FAULTS, Faults, Point
from processor.io.runtime.threads import ThreadWatch
from processor.io.telemetry.logs import describe

log = logging.getLogger("ductor.watchdog")

# (how many wakeup partitions the runs are sharded over, the ones this instance owns)
Shards = tuple[int, list[int]]


@dataclass(frozen=True)
class SweepSettings:
    interval_s: float
    grace_s: float  # lateness tolerated before an overdue run is re-woken
    stuck_after_s: float  # a live run with no transition for this long is force-failed
    limit: int  # runs per sweep
    relay_after_s: float  # outbox rows left this long are relayed by whoever sweeps first
    # A kept signal whose run never came is dead-lettered after this (a cancel never is).
    kept_signal_ttl_s: float = 300.0
    trigger_refresh_s: float = 5.0  # how often the triggers are read again


@dataclass(frozen=True)
class SweepResult:
    """What one sweep found and did, handed from the sweep thread to the poll loop."""

    # Runs to wake, with their tiers (overdue, given a kept signal, or started by a schedule).
    overdue: list[RunRef] = field(default_factory=list)
    force_failed: list[tuple[str, str]] = field(default_factory=list)  # stuck: (run, workflow)
    # The records of those ends (their children's wakeups, their parents'), written to the
    # outbox with each: (run id, transition seq, records), to send now.
    ended: list[tuple[str, int, tuple[Send, ...]]] = field(default_factory=list)
    # Outbox rows claimed for relaying: (run id, transition seq, records).
    relay: list[tuple[str, int, tuple[Send, ...]]] = field(default_factory=list)
    # Kept signals whose run never came, or came and refused them, claimed for dead letters.
    expired: list[KeptDeadLetter] = field(default_factory=list)
    triggers: TriggerSet | None = None  # read again by this sweep
    # The database restarted (or failed over) since the last sweep: the runs committed just
    # before, to wake again (engine/recent_commits.py).
    replay: list[RunRef] = field(default_factory=list)
    error: psycopg.Error | None = None
    isolated: int = 0  # exceptions nobody foresaw, each left with its item (logged here)


T = TypeVar("T")


class Watchdog:
    """Sweeps on a daemon thread with its own database connection, so a slow or hung database
    never holds the poll loop (nor a shutdown); the poll loop hands the results on."""

    def __init__(
        self,
        *,
        database: Database,
        names: TopicNames,
        owned_shards: Callable[[], Shards],
        may_relay: Callable[[], bool],
        relay_as: Callable[[], OutboxRelay],
        settings: SweepSettings,
        monotonic: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        faults: Faults = NO_FAULTS,
        recent: RecentCommits | None = None,
        threads: ThreadWatch | None = None,
    ) -> None:
        self._db = database
        self._names = names
        self._threads = threads or ThreadWatch()
        self._isolated = 0  # by the sweep running now (one at a time)
        self._recent = recent or RecentCommits()
        self._wall_ms = wall_ms
        self._faults = faults
        self._owned_shards = owned_shards
        self._may_relay = may_relay
        self._relay_as = relay_as
        self._settings = settings
        self._monotonic = monotonic
        self.next_at: float | None = monotonic() + settings.interval_s
        self._next_triggers_at = monotonic() + settings.trigger_refresh_s
        self.rewoken = 0
        self.sweeps = 0  # sweeps finished and handed on
        self._results: queue.SimpleQueue[SweepResult] = queue.SimpleQueue()
        self._sweeping = threading.Event()  # one sweep at a time
        self._lock = threading.Lock()
        self._to_park: list[tuple[str, int, str]] = []  # outbox rows to mark, for a sweep
        self._to_forget: list[KeptKey] = []  # kept signals dead-lettered, to delete

    def park(self, rows: list[tuple[str, int, str]]) -> None:
        """Outbox rows (run id, seq, why) to mark parked, by the next sweep."""
        if rows:
            with self._lock:
                self._to_park.extend(rows)

    def forget(self, keys: list[KeptKey]) -> None:
        """Kept signals whose dead letters the broker has, to delete by the next sweep."""
        if keys:
            with self._lock:
                self._to_forget.extend(keys)

    def maybe_sweep(self) -> list[SweepResult]:
        """Called every loop turn: returns the sweeps finished since, starts the next when due."""
        finished: list[SweepResult] = []
        while not self._results.empty():
            result = self._results.get_nowait()
            self.sweeps += 1
            self.rewoken += len(result.overdue)
            finished.append(result)
        now = self._monotonic()
        if (self.next_at is not None and now < self.next_at) or self._sweeping.is_set():
            return finished
        self.next_at = now + self._settings.interval_s
        modulus, owned = self._owned_shards()
        relay = self._may_relay()
        triggers = now >= self._next_triggers_at
        if triggers:
            self._next_triggers_at = now + self._settings.trigger_refresh_s
        if owned or relay or triggers or self._to_park or self._to_forget:
            self._sweeping.set()
            self._threads.start(
                self._sweep_thread, "ductor-sweep", (modulus, owned, relay, triggers)
            )
        return finished

    def _sweep_thread(self, modulus: int, owned: list[int], relay: bool, triggers: bool) -> None:
        try:
            try:
                result = self.sweep(modulus, owned, relay, triggers)
            except psycopg.OperationalError:
                # Most often a connection the database dropped while the sweep slept (it was
                # restarted): a sweep is safe to run twice, so try once more on a new one
                # before reporting an outage.
                self._db.close()
                result = self.sweep(modulus, owned, relay, triggers)
            self._results.put(result)
        except psycopg.Error as exc:
            self._db.close()
            self._results.put(SweepResult(error=exc))
        except Exception as unexpected:  # outside every part: the next sweep starts afresh
            self._db.close()
            self._left("the sweep", unexpected)
            self._results.put(SweepResult(isolated=self._isolated))
        finally:
            self._sweeping.clear()

    def sweep(
        self, modulus: int, owned: list[int], relay: bool, triggers: bool = False
    ) -> SweepResult:
        """Settle stuck runs and find overdue ones among the ``owned`` shards, when ``relay``
        claim outbox rows left behind, when ``triggers`` read the triggers again (database
        work only; the loop produces)."""
        s = self._settings
        self._isolated = 0
        self._write_marks()
        failed: list[tuple[str, str]] = []
        ended: list[tuple[str, int, tuple[Send, ...]]] = []
        woken: list[RunRef] = []
        overdue: list[RunRef] = []
        expired: list[KeptDeadLetter] = []
        if owned:
            failed, ended, woken = self._stuck(modulus, owned)
            overdue, expired = self._owned_parts(modulus, owned)
        claimed: list[tuple[str, int, tuple[Send, ...]]] = []
        if relay:
            claimed = self._part(
                "the outbox relay",
                lambda: self._db.claim_outbox(s.relay_after_s, s.limit, self._relay_as()),
                claimed,
            )
        found: TriggerSet | None = None
        if triggers:
            found = self._part("the triggers", self._db.triggers, None)
        return SweepResult(
            # Taken last, once nothing of the sweep can fail any more.
            replay=self._recent.met(self._db.server_started()),
            overdue=woken + overdue,
            force_failed=failed,
            ended=ended,
            relay=claimed,
            expired=expired,
            triggers=found,
            isolated=self._isolated,
        )

    def _write_marks(self) -> None:
        """The outbox rows to mark parked and the kept signals to forget, written first; kept
        for the next sweep if the database fails them."""
        with self._lock:
            parking, self._to_park = self._to_park, []
            forgetting, self._to_forget = self._to_forget, []
        try:
            self._db.park_outbox(parking)
            parking = []
            self._db.forget_kept_signals(forgetting)
        except psycopg.Error:
            with self._lock:  # for the next sweep
                self._to_park[:0] = parking
                self._to_forget[:0] = forgetting
            raise

    def _stuck(
        self, modulus: int, owned: list[int]
    ) -> tuple[list[tuple[str, str]], list[tuple[str, int, tuple[Send, ...]]], list[RunRef]]:
        """The stuck runs of the owned shards, settled one by one: those force-failed (with
        the records their ends wrote to the outbox) and those to wake, the waiters of the
        limit slots the force-failed gave back among them."""
        s = self._settings
        failed: list[tuple[str, str]] = []
        ended: list[tuple[str, int, tuple[Send, ...]]] = []
        woken: list[RunRef] = []
        waiters: list[RunRef] = []
        stuck = self._db.stuck(modulus, owned, s.stuck_after_s, s.grace_s, s.limit)
        self._faults.hit(Point.STUCK_SELECTED, [run_id for run_id, _seq in stuck])
        now_ms = self._wall_ms()
        for run_id, seq in stuck:
            verdict, let_in = self._settle(run_id, seq, now_ms)
            waiters += let_in
            if isinstance(verdict, Fail):
                failed.append((run_id, verdict.workflow))
                if verdict.write.effects:
                    ended.append((run_id, verdict.write.state.seq, verdict.write.effects))
            elif isinstance(verdict, Wake):
                woken.append((run_id, verdict.tier))
        marked = self._db.woken([run_id for run_id, _tier in woken])
        rewoken = [(run_id, tier) for run_id, tier in woken if run_id in marked]
        return failed, ended, rewoken + waiters

    def _owned_parts(
        self, modulus: int, owned: list[int]
    ) -> tuple[list[RunRef], list[KeptDeadLetter]]:
        """The runs to wake of the owned shards (overdue, freed lingering slots, adopted kept
        signals, fired schedules) and the kept signals claimed for their dead letters; each
        part isolated from the others."""
        s = self._settings
        none_woken: list[RunRef] = []
        overdue = self._part(
            "the overdue runs",
            lambda: self._db.overdue(modulus, owned, s.grace_s, s.limit),
            none_woken,
        )
        relay_as = self._relay_as()
        if relay_as.may_judge:  # (it judges whether the workers that ran them are gone)
            overdue += self._part(
                "the lingering slots",
                lambda: self._db.free_lingering(relay_as.gone_after_s, s.limit),
                [],
            )
        overdue += self._part(
            "the kept signals",
            lambda: self._db.adopt_kept_signals(modulus, owned, s.limit),
            [],
        )
        overdue += self._part(
            "the schedules",
            lambda: self._db.fire_schedules(modulus, owned, s.limit, self._faults, self._left),
            [],
        )
        none_claimed: list[KeptDeadLetter] = []
        expired = self._part(
            "the expired kept signals",
            lambda: self._db.claim_kept_dead_letters(
                modulus, owned, s.kept_signal_ttl_s, self._relay_as(), s.limit
            ),
            none_claimed,
        )
        if expired:
            self._faults.hit(Point.KEPT_CLAIMED, [e.key[0] for e in expired])
        return overdue, expired

    def _part(self, what: str, sweep: Callable[[], T], otherwise: T) -> T:
        """A part of the sweep; one that raised what nobody foresaw (not the database's) is
        logged and left for the next sweep (``otherwise`` stands for what it found): the
        others go on."""
        try:
            return sweep()
        except psycopg.Error:
            raise
        except Exception as exc:
            self._left(what, exc)
            return otherwise

    def _left(self, item: str, exc: Exception) -> None:
        """An exception nobody foresaw, met on one item (or part) of a sweep: logged with its
        traceback, counted, and the item left as it is (the next sweep meets it again)."""
        self._isolated += 1
        log.error(
            "sweep: an unexpected exception, isolated to %s: %s",
            item,
            describe(exc),
            exc_info=exc,
            extra={"stage": "sweep", "item": item},
        )

    def _settle(self, run_id: str, seq: int, now_ms: int) -> tuple[StuckVerdict, list[RunRef]]:
        """One stuck run, and the waiters its force-fail let in; one whose row another
        transaction holds waits for the next sweep, and so does one whose settling raised
        what nobody foresaw (logged)."""
        try:
            self._faults.hit(Point.SWEEP, run_id)
            return self._db.settle_stuck(run_id, seq, now_ms, self._names)
        except psycopg.Error as exc:
            if classify(exc) not in TRANSIENT:
                raise
            log.warning(
                "run %s: left for the next sweep: %s", run_id, exc, extra={"run_id": run_id}
            )
            return Leave(), []
        except Exception as unexpected:
            self._left(f"run {run_id}", unexpected)
            return Leave(), []

    def close(self) -> None:
        """At the end: the kept signals whose dead letters the broker has are deleted now, on
        a connection of their own (a sweep may still hold the other): left, another instance
        would send them again once this one is marked stopped."""
        with self._lock:
            forgetting, self._to_forget = self._to_forget, []
        if forgetting:
            last = self._db.sibling()
            try:
                last.forget_kept_signals(forgetting)
            except psycopg.Error as exc:
                log.error(
                    "could not delete %d dead-lettered kept signal(s): %s", len(forgetting), exc
                )
            finally:
                last.close()
        self._db.close()
