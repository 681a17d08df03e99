"""The sweeps as the poll loop sees them: each turn, the outbox rows the broker refused are
handed to the watchdog (engine/watchdog.py) to mark parked; the sweeps finished since are
taken, and the next is started when due; what a finished sweep found is carried out here,
each item isolated: overdue runs woken, stuck runs' ends counted and their records sent, rows
left in the outbox relayed, kept signals dead-lettered, the triggers followed anew.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

from processor.core.decide import reject
from processor.core.pending import RunWork
from processor.core.plans import Rules, Send
from processor.core.stats import Stats
from processor.engine.executor import Executor
from processor.engine.ledger import Ledger
from processor.engine.rewake import Rewake
from processor.engine.settling import Settler
from processor.engine.watchdog import SweepResult, Watchdog
from processor.io.kafka.delivery import Delivery
from processor.io.postgres.kept_signals import KeptDeadLetter
from processor.io.postgres.trigger_store import TriggerSet
from processor.io.runtime.outage import Outage
from processor.io.telemetry.logs import first_line

log = logging.getLogger("ductor.processor")


class Sweeps:
    def __init__(
        self,
        *,
        watchdog: Watchdog,
        executor: Executor,
        settler: Settler,
        rewake: Rewake,
        ledger: Ledger,
        delivery: Delivery,
        stats: Stats,
        postgres: Outage,
        rules: Rules,
        use_triggers: Callable[[TriggerSet], None],
    ) -> None:
        self.watchdog = watchdog
        self._executor = executor
        self._settler = settler
        self._rewake = rewake
        self._ledger = ledger
        self._delivery = delivery
        self._stats = stats
        self._postgres = postgres
        self._rules = rules
        self._use_triggers = use_triggers

    def use_rules(self, rules: Rules) -> None:
        """Rules learnt once the broker answered (the dead-letter topic's size limit)."""
        self._rules = rules

    @property
    def next_at(self) -> float | None:
        """When the next sweep is due (the loop's idle wait ends then)."""
        return self.watchdog.next_at

    def park_refused(self) -> None:
        """The outbox rows whose records the broker refused, to the watchdog to mark."""
        self.watchdog.park(self._settler.take_parked())

    def turn(self) -> None:
        """One turn of the loop: the sweeps finished since handed on, the next started when
        due."""
        for sweep in self.watchdog.maybe_sweep():
            try:
                self.hand_on(sweep)
            except Exception as exc:  # the next sweep finds what this one left
                self._ledger.isolated("sweep", "a sweep's results", exc)

    def hand_on(self, sweep: SweepResult) -> None:
        """What a sweep found, carried out (each item isolated) and logged."""
        if sweep.isolated:
            self._stats.isolated["sweep"] += sweep.isolated
        if sweep.error is not None:
            self._stats.errors[type(sweep.error).__name__] += 1
            self._postgres.failed(f"watchdog sweep: {first_line(sweep.error)}")
            return
        if not self._executor.busy:
            self._postgres.ok()  # (while a batch is in flight, its outcome says)
        self._rewake.replay_after_restart(sweep.replay)
        self._ledger.stuck_failed(sweep.force_failed)
        self._settler.send_outboxed(sweep.ended)
        self._rewake.rewake(sweep.overdue)
        self._relay(sweep.relay)
        self._dead_letter_kept(sweep.expired)
        if sweep.triggers is not None:
            self._use_triggers(sweep.triggers)
        if sweep.overdue:
            log.info("watchdog re-woke %d overdue run(s)", len(sweep.overdue))
        if sweep.relay:
            log.info(
                "relaying the records of %d transition(s) left in the outbox", len(sweep.relay)
            )

    def _relay(self, rows: list[tuple[str, int, tuple[Send, ...]]]) -> None:
        """Send again the records of outbox rows left behind (their instance died after its
        commit, or the broker was away); each row is deleted once all its records are in."""
        for run_id, _seq, sends in rows:
            self._ledger.relayed(run_id, len(sends))
        self._settler.send_outboxed(rows)

    def _dead_letter_kept(self, claimed: list[KeptDeadLetter]) -> None:
        """Dead-letter the kept signals whose run never came (``unknown_run``) or came and
        could not take them (``unknown_signal``, ``run_ended``), with the record as it was
        read and where; each is forgotten once the broker has its dead letter."""
        for signal in claimed:
            run_id = signal.key[0]
            try:
                plan = reject(signal.record, signal.reason, signal.detail, self._rules)
                self._ledger.record(RunWork(run_id, records=[signal.record]), plan)
                for send in plan.sends:
                    headers = list(send.headers)
                    done = partial(self.watchdog.forget, [signal.key])
                    self._delivery.send(send.topic, send.value, send.key, None, headers, done)
            except Exception as exc:  # it stays claimed: sent again once we are gone
                self._ledger.isolated("sweep", run_id, exc)

    def close(self) -> None:
        self.watchdog.close()


__all__ = ["Sweeps"]
