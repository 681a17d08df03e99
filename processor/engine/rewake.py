"""Runs woken again by a wakeup of this instance's own: overdue runs a sweep found, the
waiters of limit slots a commit freed, and the runs committed just before a database restart
(engine/recent_commits.py). A wakeup that is not delivered is sent again by the next sweep
(the run stays overdue), so nothing waits for its acknowledgement.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from confluent_kafka import KafkaError

from processor.core.envelope import Wakeup
from processor.core.routing import TopicNames, partition_for
from processor.core.shapes import RunRef
from processor.core.stats import Stats
from processor.engine.ledger import Ledger
from processor.engine.recent_commits import RECENT_COMMITS_S
from processor.io.kafka.clients import Publisher

log = logging.getLogger("ductor.executor")


class Rewake:
    def __init__(
        self,
        publisher: Publisher,
        partitions: Mapping[str, int],  # filled by the processor once the topics are known
        names: TopicNames,
        ledger: Ledger,
        stats: Stats,
        wall_ms: Callable[[], int],
    ) -> None:
        self._publisher = publisher
        self._partitions = partitions
        self._names = names
        self._ledger = ledger
        self._stats = stats
        self._wall_ms = wall_ms

    def rewake(self, runs: list[RunRef], reason: str = "sweep") -> None:
        """Wake overdue runs again, each on its own tier (their wakeups were lost, a deadline
        passed, or a recorded result waits for a tick)."""
        now_ms = self._wall_ms()
        for run_id, tier in runs:
            try:
                topic = self._names.wakeup(tier)
                wakeup = Wakeup(run_id=run_id, reason=reason, produced_at=now_ms)
                partition = partition_for(run_id, self._partitions[topic])
                self._publisher.send(topic, wakeup.encode(), wakeup.key(), self._sent, partition)
            except Exception as exc:  # the run stays overdue: the next sweep wakes it again
                self._ledger.isolated("sweep", run_id, exc)

    def replay_after_restart(self, runs: list[RunRef]) -> None:
        """The database restarted, or another server took its place: the runs this instance
        committed just before are woken again, in case the server lost their commits
        (engine/recent_commits.py)."""
        if not runs:
            return
        self._stats.restart_rewakes += len(runs)
        log.warning(
            "the database restarted (or another server took its place): waking again the %d"
            " run(s) committed in the %.0f s before, whose commits it may have lost",
            len(runs),
            RECENT_COMMITS_S,
            extra={"runs": len(runs)},
        )
        self.rewake(runs, reason="replay")

    def _sent(self, err: KafkaError | None, _msg: object = None) -> None:
        if err is not None:
            # The run stays overdue, so the next sweep sends it again.
            self._ledger.error("produce", "watchdog wakeup not delivered: %s", err)


__all__ = ["Rewake"]
