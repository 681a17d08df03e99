"""A bad record is one dead letter: copies sent again after a crash (the same source topic,
partition and offset) are folded into the first read, whatever dead-letter partition they
landed on (io/kafka/dlq.py)."""

from __future__ import annotations

from processor.core.dead_letters import dead_letter_headers
from processor.io.kafka.dlq import DeadLetter, Folded


def _letter(dlq_partition: int, dlq_offset: int, source_offset: int, reason: str) -> DeadLetter:
    headers = dead_letter_headers([], reason, "why", "ductor.wakeup.t1", 2, source_offset)
    return DeadLetter(dlq_partition, dlq_offset, b"k", b"v", headers)


def test_copies_of_a_record_are_one_dead_letter_counted_in_copies() -> None:
    folded = Folded()
    read = [
        _letter(0, 0, 10, "not_json"),
        _letter(0, 1, 11, "not_json"),
        _letter(1, 0, 10, "not_json"),  # a copy, on another partition of the topic
        _letter(0, 2, 10, "not_json"),  # and another
    ]
    assert all(folded.add(letter) for letter in read)
    letters = folded.letters()
    assert [(d.partition, d.offset, d.source_offset, d.copies) for d in letters] == [
        (0, 0, 10, 3),
        (0, 1, 11, 1),
    ]


def test_letters_without_a_source_are_each_their_own() -> None:
    folded = Folded()
    folded.add(DeadLetter(0, 5, None, b"x", []))
    folded.add(DeadLetter(0, 6, None, b"x", []))
    assert [(d.offset, d.copies) for d in folded.letters()] == [(5, 1), (6, 1)]


def test_the_limit_and_the_reason_count_records_not_copies() -> None:
    folded = Folded(reason="oversize", limit=2)
    assert folded.add(_letter(0, 0, 1, "oversize"))
    assert folded.add(_letter(0, 1, 1, "oversize"))  # a copy: not one more
    assert folded.add(_letter(0, 2, 2, "not_json"))  # another reason: not kept
    assert not folded.add(_letter(0, 3, 3, "oversize"))  # the second kept: enough
    assert [(d.source_offset, d.copies) for d in folded.letters()] == [(1, 2), (3, 1)]
