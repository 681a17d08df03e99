"""What the client keeps between calls (processor/client/kept.py), without the services: the
partition counts it trusts for a while, one producer per configuration, and a fresh keep in
a forked child."""

from __future__ import annotations

from typing import Any

from processor.client import kept


class _FakeProducer:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.left = int(config.get("left", 0))  # records not yet delivered
        self.flushed = 0

    def __len__(self) -> int:
        return self.left

    def flush(self, _timeout: float) -> int:
        self.flushed += 1
        return 0


# Stand-ins typed as what the module takes (it keeps them, asks their length and flushes
# those with records left at the end).
_Producer: Any = _FakeProducer
_ANY_PRODUCER: Any = object()


def test_a_partition_count_is_asked_again_only_once_it_is_old() -> None:
    asked: list[str] = []

    def ask(_producer: Any, topic: str) -> int:
        asked.append(topic)
        return 6

    kept.forget_all()
    producer = _ANY_PRODUCER
    assert kept.partition_count(producer, "t", ask, now=100.0) == 6
    assert kept.partition_count(producer, "t", ask, now=100.0 + kept.PARTITIONS_FOR_S - 1) == 6
    assert asked == ["t"]
    kept.partition_count(producer, "t", ask, now=100.0 + kept.PARTITIONS_FOR_S + 1)
    assert asked == ["t", "t"]


def test_one_producer_per_configuration() -> None:
    kept.forget_all()
    try:
        first = kept.kept_producer({"client.id": "a"}, _Producer)
        assert kept.kept_producer({"client.id": "a"}, _Producer) is first
        assert kept.kept_producer({"client.id": "b"}, _Producer) is not first
    finally:
        kept.forget_all()


def test_a_forked_child_keeps_nothing_of_its_parent(monkeypatch: Any) -> None:
    kept.forget_all()
    try:
        parent = kept.kept_producer({"client.id": "a"}, _Producer)
        monkeypatch.setattr("os.getpid", lambda: -1)  # as if in a child after a fork
        assert kept.kept_producer({"client.id": "a"}, _Producer) is not parent
    finally:
        monkeypatch.undo()
        kept.forget_all()


def test_at_exit_only_a_producer_with_records_left_is_flushed() -> None:
    """A flush polls, and a poll at exit reports every broker that went away since on
    stderr: a producer with nothing left is not polled."""
    kept.forget_all()
    idle: Any = kept.kept_producer({"client.id": "idle"}, _Producer)
    busy: Any = kept.kept_producer({"client.id": "busy", "left": 2}, _Producer)
    kept.forget_all()
    assert (idle.flushed, busy.flushed) == (0, 1)
