"""How a named worker joins its group.

A worker with a name (``DUCTOR_WORKER_NAME``) is a static member of its group. Under the
consumer protocol the broker refuses its name (UNRELEASED_INSTANCE_ID, fatal for the client)
while the member of a previous process of the same name has not left: one killed without
leaving holds it until its session ends. The worker then joins again with a new consumer every
second until the broker lets it (``StaticJoin``), instead of exiting for a supervisor that
would start it again into the same refusal.
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError

from processor.io.kafka.logs import ClientLog

log = logging.getLogger("ductor.worker")

# A worker whose name the broker still counts as another member's joins again this often.
_UNRELEASED_RETRY_S = 1.0
# ... and says so again this often while it waits (another live worker may have its name).
_UNRELEASED_WARN_EVERY_S = 30.0
# What librdkafka's fatal error says when the broker refuses a static member's name.
_UNRELEASED_TEXT = KafkaError(KafkaError.UNRELEASED_INSTANCE_ID).str()


class StaticJoin:
    """A named worker's join that the broker refuses while its name is a previous member's
    (``UNRELEASED_INSTANCE_ID``): when to try again, and what to say meanwhile."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.client_log = ClientLog(expected=lambda text: _UNRELEASED_TEXT in text)
        self.refused_since: float | None = None  # the first refusal of this wait
        self._retry_at: float | None = None
        self._warned_at = 0.0

    @staticmethod
    def is_refusal(error: KafkaError) -> bool:
        """Whether a client error is the broker refusing the name (reported either as its own
        code or, by a consumer, as a fatal error whose text names it)."""
        code = error.code()
        return code == KafkaError.UNRELEASED_INSTANCE_ID or (
            code == KafkaError._FATAL and _UNRELEASED_TEXT in error.str()
        )

    def refused(self, now: float) -> None:
        if self._retry_at is not None:
            return  # (the same refusal, reported twice)
        if self.refused_since is None:
            self.refused_since = now
        self._retry_at = now + _UNRELEASED_RETRY_S
        if now - self._warned_at >= _UNRELEASED_WARN_EVERY_S:
            self._warned_at = now
            log.warning(
                "the broker still counts worker name %r as another member's (a previous"
                " process of that name died without leaving: until its session ends, at most"
                " DUCTOR_WORKER_SESSION_TIMEOUT_MS; or another live worker has this name):"
                " joining again every %.0f s",
                self.name,
                _UNRELEASED_RETRY_S,
                extra={"waited_s": round(now - self.refused_since, 1)},
            )

    def due(self, now: float) -> bool:
        """Whether to join again now (once per refusal)."""
        if self._retry_at is None or now < self._retry_at:
            return False
        self._retry_at = None
        return True

    def joined(self) -> None:
        """Partitions came: the name is this worker's."""
        if self.refused_since is not None:
            log.info("the broker took worker name %r", self.name)
        self.refused_since = None
