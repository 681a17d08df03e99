"""Consumed records as the core sees them: a Protocol of the client's message (so tests build
plain fakes of a *message*, never of the broker), headers, and the record kept while in flight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from processor.core.envelope import Wakeup
from processor.core.shapes import TopicPartition

Headers = list[tuple[str, bytes]]


class MessageError(Protocol):
    """The part of the client's error object the processor reads."""

    def code(self) -> int: ...
    def str(self) -> str: ...


class KafkaMessage(Protocol):
    """What the processor reads from a consumed record."""

    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def headers(
        self,
    ) -> list[tuple[str, str | bytes | None]] | dict[str, str | bytes | None] | None: ...
    def error(self) -> MessageError | None: ...


# The trace context headers: what rides on from a record to the records produced for it.
TRACE_HEADERS = ("traceparent", "tracestate")


def normalise_headers(message: KafkaMessage, only: tuple[str, ...] | None = None) -> Headers:
    """A record's headers as (name, bytes) pairs, whatever form the client returned; only
    those named in ``only`` when given (cheaper than normalising all to keep a few)."""
    raw = message.headers() or []
    pairs = raw.items() if isinstance(raw, dict) else raw
    return [
        (k, v.encode() if isinstance(v, str) else (v or b""))
        for k, v in pairs
        if only is None or k in only
    ]


@dataclass(slots=True)
class Inbound:
    """A consumed record, kept with what is needed to dead-letter it or store its offset."""

    tp: TopicPartition
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    tier: str
    wakeup: Wakeup | None = None

    # Written out: the compiled build compiles it, where the dataclass decorator's own is
    # interpreted Python, ~20 x dearer; one is built per consumed record.
    # tests/unit/test_dataclass_inits.py holds it to its fields.
    def __init__(
        self,
        tp: TopicPartition,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        tier: str,
        wakeup: Wakeup | None = None,
    ) -> None:
        self.tp = tp
        self.offset = offset
        self.key = key
        self.value = value
        self.headers = headers
        self.tier = tier
        self.wakeup = wakeup
