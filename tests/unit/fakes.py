"""Plain fakes of a consumed *message* (the KafkaMessage protocol), never of the broker or the
database, and builders of the values the engine's decisions take."""

from __future__ import annotations

from dataclasses import dataclass, field

from processor.core.envelope import Wakeup
from processor.core.intake import Accepted, RecordVerdict, admit
from processor.core.model import LoadedRun
from processor.core.plans import BatchItem
from processor.core.records import Inbound, MessageError
from processor.core.routing import TopicNames
from processor.core.run_state import RunState, initial_state, state_checksum
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import WorkflowDef

NAMES = TopicNames("t")
MAX_BYTES = 65536
NOW_MS = 1_700_000_000_000

WF: WorkflowDef = parse_workflow(
    {
        "name": "pair",
        "version": 1,
        "steps": [
            {"name": "first", "type": "fast"},
            {"name": "second", "type": "fast", "depends_on": ["first"]},
        ],
    }
)


@dataclass
class FakeMessage:
    """A consumed record as the client hands it over."""

    topic_: str
    offset_: int
    value_: bytes | None
    partition_: int = 0
    key_: bytes | None = b"k"
    headers_: list[tuple[str, str | bytes | None]] = field(default_factory=list)

    def topic(self) -> str | None:
        return self.topic_

    def partition(self) -> int | None:
        return self.partition_

    def offset(self) -> int | None:
        return self.offset_

    def key(self) -> bytes | None:
        return self.key_

    def value(self) -> bytes | None:
        return self.value_

    def headers(self) -> list[tuple[str, str | bytes | None]] | None:
        return self.headers_

    def error(self) -> MessageError | None:
        return None


def wakeup_message(
    offset: int, wakeup: Wakeup, topic: str | None = None, partition: int = 0
) -> FakeMessage:
    return FakeMessage(
        topic or NAMES.wakeup("t1"), offset, wakeup.encode(), partition, key_=wakeup.key()
    )


def accepted(message: FakeMessage, now_ms: int = NOW_MS) -> Inbound:
    verdict: RecordVerdict = admit(message, NAMES, MAX_BYTES, now_ms)
    assert isinstance(verdict, Accepted), verdict
    return verdict.record


def loaded(
    run_id: str, state: RunState | None = None, version: int = 1, tampered: bool = False
) -> LoadedRun:
    """A run of ``WF`` as the store would load it (initial state unless given)."""
    state = state or initial_state(WF)
    checksum = "0" * 32 if tampered else state_checksum(state)
    return LoadedRun(run_id, WF, state, version, "t1", stored_checksum=checksum)


def item(run_id: str, records: list[Inbound], tries: int = 0) -> BatchItem:
    return BatchItem(run_id, tries, tuple(records))
