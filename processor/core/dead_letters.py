"""The dead-letter record format: the original record plus ``ductor.dlq.*`` headers.

Written by the executor, read back by `ductor dlq list` and `replay` (io/dlq.py).
"""

from __future__ import annotations

from processor.core.records import Headers

DLQ_HEADER_PREFIX = "ductor.dlq."
REASON, DETAIL, SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET = (
    f"{DLQ_HEADER_PREFIX}{name}" for name in ("reason", "detail", "topic", "partition", "offset")
)


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
