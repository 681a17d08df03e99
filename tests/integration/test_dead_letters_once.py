"""One dead letter per bad record, across kills too. A record's offset is committed only after
the broker has its dead letter, so an instance SIGKILLed in between (fault point
``dead_lettered``: right after the acknowledgement, before the offset is stored) leaves the
record to the next owner of its partition, which dead-letters it again with the same source
position. That position is the dead letter's identity: `ductor dlq list`, the web page and
``read_dead_letters`` show each bad record once, its copies folded into it."""

from __future__ import annotations

import html
import re
import urllib.request
from dataclasses import replace
from functools import partial
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message, Producer

from processor.core.routing import TopicNames
from processor.io.config.settings import Settings
from processor.io.kafka.dlq import read_dead_letters

from .children import Spawned, run_ductor
from .scrape import free_port
from .waiting import wait_for

pytestmark = pytest.mark.integration

BAD = 300
KILL_AFTER = 70  # dead letters acknowledged by an instance before its fault kills it
PAGE_ROWS = 200  # the web page's first dead letters (processor/ui/app.py)


def _write_bad_records(settings: Settings) -> set[tuple[str, int, int]]:
    """BAD records that are not JSON, over the partitions of a wakeup topic: where each went."""
    topic = TopicNames(settings.topic_prefix).wakeup("t1")
    where: set[tuple[str, int, int]] = set()

    def delivered(err: KafkaError | None, msg: Message) -> None:
        assert err is None, err
        partition, offset = msg.partition(), msg.offset()
        assert partition is not None and offset is not None
        where.add((topic, partition, offset))

    producer = Producer(settings.kafka_common())
    for i in range(BAD):
        value = b"\x00not json " + str(i).encode()
        producer.produce(topic, value, f"bad-{i}", partition=i % 3, on_delivery=delivered)
    assert producer.flush(30) == 0
    assert len(where) == BAD
    return where


def _page_sources(port: int) -> list[str]:
    """The "From" cell of each row of the web page's dead letters."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/dead-letters", timeout=30) as reply:
        page = reply.read().decode()
    body = page.split('id="letters"', 1)[1]
    rows = re.findall(r"<tr>\s*<td>[^<]*</td>\s*<td>.*?</td>\s*<td>([^<]*)</td>", body, re.S)
    return [html.unescape(r) for r in rows]


def test_each_bad_record_is_one_dead_letter_though_its_instances_were_killed(
    settings: Settings, spawn: Any
) -> None:
    positions = _write_bad_records(settings)
    # Two instances killed in turn right after a dead letter was acknowledged, before its
    # offset passed: each redoes what the previous one had dead-lettered since its last commit.
    doomed = replace(settings, test_faults=f"dead_lettered=kill@{KILL_AFTER}")
    for name in ("first", "second"):
        instance: Spawned = spawn(["process"], doomed, name)
        wait_for(partial(_exited, instance), 90, f"the {name} instance's kill")
        assert instance.proc.returncode == -9, instance.log_path.read_text()[-2000:]
    heir = spawn(["process"], settings, "heir")
    wait_for(
        lambda: heir.running() and {d.identity for d in read_dead_letters(settings)} == positions,
        90,
        "a dead letter for every bad record",
    )
    assert heir.terminate() == 0

    letters = read_dead_letters(settings)
    assert len(letters) == BAD  # each bad record once
    assert {d.identity for d in letters} == positions
    assert {d.reason for d in letters} == {"not_json"}
    copies = sum(d.copies for d in letters)
    assert copies > BAD, "no record was dead-lettered twice: the kills redid nothing"
    assert len(read_dead_letters(settings, reason="not_json", limit=BAD // 2)) == BAD // 2

    listed = run_ductor(settings, "dlq", "list")
    assert listed.returncode == 0, listed.stderr
    assert len(listed.stdout.splitlines()) == BAD
    assert f"{BAD} dead letter(s) listed" in listed.stderr
    folded = sum(1 for d in letters if d.copies > 1)
    assert f"({folded} of them dead-lettered again" in listed.stderr

    port = free_port()
    ui = spawn(["ui", "--port", str(port)], settings, "ui")
    wait_for(lambda: ui.running() and _reachable(port), 60, "the web page to answer")
    shown = _page_sources(port)
    assert len(shown) == PAGE_ROWS and len(set(shown)) == PAGE_ROWS


def _exited(child: Spawned) -> bool:
    return child.proc.poll() is not None


def _reachable(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10):
            return True
    except OSError:
        return False
