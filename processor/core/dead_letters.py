"""The dead-letter record format: the original record plus ``ductor.dlq.*`` headers.

Written by the executor, read back by `ductor dlq list` and `replay` (io/kafka/dlq.py).
"""

from __future__ import annotations

from processor.core.records import Headers

DLQ_HEADER_PREFIX = "ductor.dlq."
REASON, DETAIL, SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET, TRUNCATED = (
    f"{DLQ_HEADER_PREFIX}{name}"
    for name in ("reason", "detail", "topic", "partition", "offset", "truncated")
)
# What a record costs beyond its key, value and headers' bytes (sizes, timestamps, the batch
# it rides in): kept free under the limit so that a dead letter always fits.
RECORD_OVERHEAD_BYTES = 512


def dead_letter_headers(
    original: Headers, reason: str, detail: str, topic: str, partition: int, offset: int
) -> Headers:
    """The headers of a dead letter: the record's own (but any named like ours: a record must
    not bring its own verdict), then why and where it came from."""
    return [
        *(h for h in original if not h[0].startswith(DLQ_HEADER_PREFIX)),
        (REASON, reason.encode()),
        (DETAIL, detail.encode()[:1000]),
        (SOURCE_TOPIC, topic.encode()),
        (SOURCE_PARTITION, str(partition).encode()),
        (SOURCE_OFFSET, str(offset).encode()),
    ]


def truncate_dead_letter(
    key: bytes | None, value: bytes | None, headers: Headers, max_bytes: int
) -> tuple[bytes | None, Headers]:
    """The value and headers of a dead letter that fits in ``max_bytes``: unchanged when it
    fits; else the value cut to what fits (the record's own headers dropped too if they alone
    do not fit) and a ``ductor.dlq.truncated`` header giving the original value's size. The
    dead letter of a record too large to keep whole still says what it was, never fails."""

    def size(hs: Headers) -> int:
        return len(key or b"") + sum(len(k) + len(v) for k, v in hs) + RECORD_OVERHEAD_BYTES

    if value is None or size(headers) + len(value) <= max_bytes:
        return value, headers
    marked = [*headers, (TRUNCATED, str(len(value)).encode())]
    if size(marked) > max_bytes:  # the record's own headers are the bulk: keep only ours
        marked = [h for h in marked if h[0].startswith(DLQ_HEADER_PREFIX)]
    return value[: max(0, max_bytes - size(marked))], marked
