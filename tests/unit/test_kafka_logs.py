"""librdkafka's lines go through the project's logger (io/kafka/logs.py): at the levels
confluent-kafka maps librdkafka's syslog levels to, with the client and the facility as
fields, a kind of line repeated during an outage logged ever less often with a count of what
was left out; and every Kafka client of the package is made so."""

from __future__ import annotations

import ast
import itertools
import logging
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
from confluent_kafka import Producer

from processor.client import common
from processor.io.kafka.logs import MAX_REPEAT_S, ClientLog, pid_retry, with_logger

PACKAGE = Path(__file__).resolve().parents[2] / "processor"
_CLIENT = "ductor-1#producer-1"
_REFUSED = (
    "[thrd:127.0.0.1:1/bootstrap]: 127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed:"
    " Connection refused (after {ms}ms in state CONNECT)"
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def client(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> ClientLog:
    caplog.set_level(logging.DEBUG, logger="test.librdkafka")
    return ClientLog(logging.getLogger("test.librdkafka"), clock)


def _feed(
    client: ClientLog,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
    times: Iterable[float],
    facility: str = "FAIL",
    level: int = logging.ERROR,
) -> list[float]:
    """One refused connection at each of ``times``; the times at which a line was logged."""
    logged = []
    for i, now in enumerate(times):
        clock.now = now
        before = len(caplog.records)
        client.log(level, "%s [%s] %s", facility, _CLIENT, _REFUSED.format(ms=i % 7))
        if len(caplog.records) > before:
            logged.append(round(now, 2))
    return logged


def _suppressed(caplog: pytest.LogCaptureFixture) -> list[int]:
    return [r.__dict__.get("suppressed", 0) for r in caplog.records]


def test_a_repeated_line_is_logged_ever_less_often_counting_what_was_left_out(
    client: ClientLog, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    # 20 lines a second for 200 s, as a consumer reconnecting to a broker that refuses; the
    # numbers in the text differ, the kind of line is the same.
    logged = _feed(client, clock, caplog, (i / 20 for i in range(4000)))
    assert logged == [0.0, 5.0, 15.0, 35.0, 75.0, 155.0]
    assert _suppressed(caplog) == [0, 99, 199, 399, 799, 1599]
    first = caplog.records[0]
    assert (first.levelno, first.name, first.getMessage()) == (
        logging.ERROR,
        "test.librdkafka",
        _REFUSED.format(ms=0),
    )
    assert (first.__dict__["client"], first.__dict__["facility"]) == (_CLIENT, "FAIL")
    assert "suppressed" not in first.__dict__


def test_the_wait_between_two_lines_of_a_kind_is_capped(
    client: ClientLog, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    # One line every 10 s (a producer's reconnect backoff at its longest), for over an hour.
    logged = _feed(client, clock, caplog, (i * 10.0 for i in range(400)))
    assert logged[:6] == [0, 10, 20, 40, 80, 160]
    waits = [b - a for a, b in itertools.pairwise(logged)]
    assert max(waits) == MAX_REPEAT_S and waits[-1] == MAX_REPEAT_S
    # Every line up to the last one logged was logged or counted.
    assert len(logged) + sum(_suppressed(caplog)) == logged[-1] / 10 + 1


def test_a_kind_quiet_for_the_longest_wait_starts_again_with_its_count(
    client: ClientLog, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    first = _feed(client, clock, caplog, [0.0, 1.0, 2.0])
    later = 2.0 + MAX_REPEAT_S
    again = _feed(client, clock, caplog, [later, later + 1, later + 5])
    assert (first, again) == ([0.0], [later, later + 5])
    assert _suppressed(caplog) == [0, 2, 1]


def test_kinds_are_limited_apart_and_debug_lines_not_at_all(
    client: ClientLog, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    assert _feed(client, clock, caplog, [0.0, 1.0]) == [0.0]
    assert _feed(client, clock, caplog, [1.0, 2.0], facility="CONNECT") == [1.0]
    assert _feed(client, clock, caplog, [2.0, 2.0, 2.0], level=logging.DEBUG) == [2.0] * 3
    client.log(logging.ERROR, "%s [%s] %s", "FAIL", _CLIENT, "Another failure")
    assert caplog.records[-1].getMessage() == "Another failure"


def test_a_line_below_the_level_logged_is_neither_logged_nor_counted(
    client: ClientLog, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="test.librdkafka")
    assert _feed(client, clock, caplog, [0.0, 1.0], level=logging.WARNING) == []
    assert _feed(client, clock, caplog, [2.0, 3.0]) == [2.0]
    assert _suppressed(caplog) == [0]


def test_a_real_client_logs_through_the_logger_at_the_mapped_levels(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """librdkafka's syslog levels as they arrive: 3 (a refused connection) as ERROR, 4 (a
    property this kind of client ignores) as WARNING, 7 (a debug context) as DEBUG; all
    through the logger, on the thread that polls, none written to stderr by librdkafka."""
    caplog.set_level(logging.DEBUG, logger="ductor.librdkafka")
    config = {"bootstrap.servers": "127.0.0.1:1", "auto.offset.reset": "earliest"}
    producer = Producer(with_logger({**config, "client.id": "test-logs", "debug": "broker"}))
    levels: dict[str, set[int]] = {}

    def seen() -> bool:
        """Every line asserted below arrived: a refused connection is logged at DEBUG
        (its debug context) before it is at ERROR, so a FAIL line alone is not enough."""
        return (
            logging.ERROR in levels.get("FAIL", set())
            and "CONFWARN" in levels
            and logging.DEBUG in set().union(*levels.values())
        )

    deadline = time.monotonic() + 20
    while not seen() and time.monotonic() < deadline:
        producer.poll(0.1)  # the client's lines wait in its queue until it is polled
        for record in caplog.records:
            levels.setdefault(record.__dict__["facility"], set()).add(record.levelno)
    assert logging.ERROR in levels["FAIL"], levels
    assert levels["CONFWARN"] == {logging.WARNING}
    assert logging.DEBUG in set().union(*levels.values())
    assert all(r.__dict__["client"].startswith("test-logs#producer-") for r in caplog.records)
    producer.flush(0)
    assert "%3|" not in capfd.readouterr().err


# Clients made with a logger of their own that drops every line: their callers say in one
# sentence what they found (refused credentials, a failed check).
_SILENT = {
    ("io/kafka/clients.py", "check_authentication"),
    ("io/config/check.py", "_kafka_clients"),
}


def test_every_kafka_client_of_the_package_logs_through_the_logger() -> None:
    unlogged, made = [], 0
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(PACKAGE))
        tree = ast.parse(path.read_text())
        silent = {
            id(node)
            for function in ast.walk(tree)
            if isinstance(function, ast.FunctionDef) and (where, function.name) in _SILENT
            for node in ast.walk(function)
        }
        for call in ast.walk(tree):
            if (
                isinstance(call, ast.Call)
                and _name(call.func) in _CLIENTS
                and id(call) not in silent
            ):
                made += 1
                config = call.args[0] if call.args else None
                if not (isinstance(config, ast.Call) and _name(config.func) == "with_logger"):
                    unlogged.append(f"{where}:{call.lineno}")
    assert made > 20  # (the walk sees the package's clients)
    assert not unlogged, f"Kafka clients made without with_logger(...): {unlogged}"


_CLIENTS = {"Producer", "Consumer", "AdminClient"}


def _name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else None


def test_a_line_its_client_expects_is_logged_at_info(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="test.librdkafka")
    log = ClientLog(logging.getLogger("test.librdkafka"), clock, lambda text: "expected" in text)
    log.log(logging.CRITICAL, "%s [%s] %s", "FATAL", _CLIENT, "an expected refusal")
    log.log(logging.CRITICAL, "%s [%s] %s", "FATAL", _CLIENT, "anything else")
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.CRITICAL]


def test_a_pid_retry_of_a_fresh_broker_is_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    """The idempotent producer's retry while a broker that just started loads its
    coordinator: librdkafka asks again by itself; the client says it at INFO, not WARNING."""
    line = (
        "[thrd:main]: Failed to acquire idempotence PID from broker 127.0.0.1:19092/1:"
        " Broker: Coordinator load in progress: retrying"
    )
    assert pid_retry(line)
    assert not pid_retry("[thrd:main]: Failed to acquire idempotence PID: Broker: fatal")
    assert not pid_retry("127.0.0.1:19092/1: Connect to ipv4#127.0.0.1:19092 failed: retrying")
    log = logging.getLogger("test.pid-retry")
    with caplog.at_level(logging.INFO, logger=log.name):
        ClientLog(log, expected=pid_retry).log(logging.WARNING, "%s", "GETPID", "c", line)
    assert [r.levelno for r in caplog.records] == [logging.INFO]


def test_the_clients_producer_keeps_a_pid_retry_off_the_commands_stderr(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The client's producer logs through a logger that lets warnings through and drops its
    INFO lines: a fresh broker's PID retry never reaches a command's stderr."""
    line = "[thrd:main]: Failed to acquire idempotence PID from broker b: Broker: x: retrying"
    with caplog.at_level(logging.DEBUG):
        common._CLIENT_LOG.setLevel(logging.WARNING)  # as the module sets it (caplog may not)
        client_log = ClientLog(common._CLIENT_LOG, expected=pid_retry)
        client_log.log(logging.WARNING, "%s", "GETPID", "c", line)
        client_log.log(logging.WARNING, "%s", "FAIL", "c", "broker down")
    assert [r.getMessage() for r in caplog.records if r.name == common._CLIENT_LOG.name] == [
        "broker down"
    ]
