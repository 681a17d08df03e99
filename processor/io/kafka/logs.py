"""librdkafka's own log lines through the project's logger (``ductor.librdkafka``), so a
process writes one stream (JSON or text, io/telemetry/logs.py) instead of raw ``%3|...|FAIL|...``
lines.

Every Kafka client is made with ``with_logger(config)``. confluent-kafka calls the ``logger``
of a client's configuration as ``logger.log(level, "%s [%s] %s", facility, client, text)``, with
librdkafka's syslog level already mapped: 0-2 CRITICAL, 3 ERROR, 4 WARNING, 5-6 INFO, 7 DEBUG
(only with a ``debug`` property). It also sets ``log.queue``: a line waits in the client's
queue until the client is polled (``poll``, ``consume``, ``flush``) and is logged on the
thread that polls, never on one of librdkafka's own. So a client that is never polled logs
nothing, and keeps its lines in memory until it is closed: every long-lived client is polled.

During an outage each client reports the same failure over and over (a consumer reconnects
about 20 times a second to a broker that refuses). A line of the same kind (facility and
text, numbers aside) is therefore logged at once, then no sooner than 5 s after, then 10,
20 s ... and at most every 5 min while it keeps coming; the line logged after a wait counts the
ones left out (``suppressed``). A kind quiet for 5 min starts again from the beginning. Debug
lines are all logged: whoever turned librdkafka's debug contexts on wants them.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from processor.core.backoff import retry_delay_s

FIRST_REPEAT_S = 5.0
MAX_REPEAT_S = 300.0
# Kinds remembered per client, past which all are forgotten (a bound on memory, not a limit
# anyone meets: a client has a few dozen kinds of lines; forgotten, a kind is logged at once).
_MAX_KINDS = 512
_NUMBERS = re.compile(r"\d+")


def with_logger(config: Mapping[str, Any], log: ClientLog | None = None) -> dict[str, Any]:
    """A client's configuration whose librdkafka lines go through the project's logger, with
    a limiter of the client's own (or ``log``'s, shared by the clients given it)."""
    return {**config, "logger": log or ClientLog()}


@dataclass
class _Kind:
    logged: int  # lines of this kind logged since it started
    next_at: float  # none before then
    seen_at: float  # the last line of this kind, logged or not
    suppressed: int = 0  # left out since the last one logged


def pid_retry(text: str) -> bool:
    """An idempotent producer's "Failed to acquire idempotence PID ...: retrying": a broker
    that has just started answers "coordinator load in progress" for a moment, and librdkafka
    asks again by itself. A short-lived client (a `ductor` command) said it as a warning that
    its user could do nothing about."""
    return "Failed to acquire idempotence PID" in text and text.endswith("retrying")


class ClientLog:
    """One client's ``logger``: its lines to ``log``, as many as the rate limit lets through.
    Locked: whichever thread polls the client logs its lines."""

    def __init__(
        self,
        log: logging.Logger | None = None,
        clock: Callable[[], float] = time.monotonic,
        expected: Callable[[str], bool] | None = None,
    ) -> None:
        """``expected``: lines the caller handles and says itself, logged at INFO whatever
        librdkafka's level (a fatal error the client's owner recovers from is no critical)."""
        self._log = log or logging.getLogger("ductor.librdkafka")
        self._clock = clock
        self._expected = expected
        self._kinds: dict[tuple[str, str], _Kind] = {}
        self._lock = threading.Lock()

    def log(self, level: int, _format: str, facility: str, client: str, text: str) -> None:
        if level > logging.INFO and self._expected is not None and self._expected(text):
            level = logging.INFO
        if not self._log.isEnabledFor(level):
            return
        suppressed = 0 if level <= logging.DEBUG else self._admit(facility, text)
        if suppressed is None:
            return
        extra: dict[str, Any] = {"client": client, "facility": facility}
        if suppressed:
            extra["suppressed"] = suppressed
        self._log.log(level, "%s", text, extra=extra)

    def _admit(self, facility: str, text: str) -> int | None:
        """None: leave this line out; else log it, saying how many of its kind were left out
        since the last one."""
        key = (facility, _NUMBERS.sub("#", text))
        now = self._clock()
        with self._lock:
            kind = self._kinds.get(key)
            if kind is None or now - kind.seen_at >= MAX_REPEAT_S:
                if len(self._kinds) >= _MAX_KINDS:
                    self._kinds.clear()
                kind = self._kinds[key] = _Kind(0, now, now, kind.suppressed if kind else 0)
            kind.seen_at = now
            if now < kind.next_at:
                kind.suppressed += 1
                return None
            suppressed, kind.suppressed = kind.suppressed, 0
            kind.next_at = now + retry_delay_s(kind.logged, FIRST_REPEAT_S, MAX_REPEAT_S)
            kind.logged += 1
            return suppressed
