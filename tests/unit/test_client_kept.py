"""What the client keeps between calls (processor/client/kept.py), without the services: the
partition counts it trusts for a while, one producer per configuration, and a fresh keep in
a forked child."""

from __future__ import annotations

from typing import Any

from processor.client import kept


class _FakeProducer:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    def flush(self, _timeout: float) -> int:
        return 0


# Stand-ins typed as what the module takes (it only keeps them and calls flush at the end).
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
