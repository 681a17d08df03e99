"""One log stream: with the broker unreachable, `ductor process` writes JSON lines only, its
Kafka clients' own lines among them (io/kafka/logs.py), and the refused connections that
librdkafka reports many times a second are a few lines that count what they left out."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest

from processor.io.config.settings import Settings

from .children import Spawned, still_running
from .waiting import wait_for

pytestmark = pytest.mark.integration

_WATCH_S = 10.0


def _librdkafka(child: Spawned) -> list[dict[str, Any]]:
    return [line for line in child.log_lines() if line.get("logger") == "ductor.librdkafka"]


def test_librdkafka_lines_are_json_and_rate_limited_while_the_broker_is_unreachable(
    settings: Settings, spawn: Any
) -> None:
    # Nothing listens on port 1: every connection is refused at once.
    child = spawn(["process"], settings, "process", {"DUCTOR_BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    started_at = time.monotonic()
    wait_for(
        lambda: still_running(child) and time.monotonic() - started_at > _WATCH_S,
        60,
        f"the processor to run {_WATCH_S:.0f} s",
        0.2,
    )
    wait_for(
        lambda: any(line.get("suppressed") for line in _librdkafka(child)),
        30,
        "a client's line counting the lines it left out",
    )
    assert child.terminate() == 0

    raw = child.log_path.read_bytes().splitlines()
    not_json = []
    for line in raw:
        try:
            orjson.loads(line)
        except orjson.JSONDecodeError:
            not_json.append(line)
    assert not not_json, not_json[:3]

    refused = [line for line in _librdkafka(child) if "Connection refused" in line["msg"]]
    clients = {line["client"] for line in refused}
    assert {c.split("#")[1].rsplit("-", 1)[0] for c in clients} == {"producer", "consumer"}
    assert all(line["level"] == "ERROR" and line["facility"] == "FAIL" for line in refused)
    # librdkafka reported about 20 a second per client; a few lines say so, counting the rest.
    suppressed = sum(line.get("suppressed", 0) for line in refused)
    assert len(refused) <= 4 * len(clients), [line["ts"] for line in refused]
    assert suppressed > 10 * len(refused), (len(refused), suppressed)
    print(f"{len(refused)} lines about refused connections, {suppressed} more counted")
