"""Structured logs: JSON lines with the fields passed as extras, trace ids from a span."""

from __future__ import annotations

import logging
import sys

import orjson
import pytest
from opentelemetry.sdk.trace import TracerProvider

from processor.io.telemetry.logs import JsonFormatter, TextFormatter, escape_control
from processor.io.telemetry.spans import log_ids


def _record(**extra: object) -> logging.LogRecord:
    record = logging.LogRecord(
        "ductor.test", logging.WARNING, __file__, 1, "run %s failed", ("r1",), None
    )
    record.__dict__.update(extra)
    return record


def test_json_lines_carry_the_message_and_the_extra_fields() -> None:
    line = orjson.loads(JsonFormatter().format(_record(run_id="r1", reason="livelock")))
    assert line["msg"] == "run r1 failed"
    assert line["level"] == "WARNING"
    assert line["run_id"] == "r1" and line["reason"] == "livelock"
    assert "trace_id" not in line


def test_a_span_gives_its_trace_and_span_ids_to_the_log_line() -> None:
    span = TracerProvider().get_tracer("t").start_span("process x")
    ids = log_ids(span)
    line = orjson.loads(JsonFormatter().format(_record(**ids)))
    context = span.get_span_context()
    assert line["trace_id"] == f"{context.trace_id:032x}"
    assert line["span_id"] == f"{context.span_id:016x}"
    assert log_ids(None) == {}


def test_text_lines_are_readable() -> None:
    text = TextFormatter().format(_record(run_id="r1"))
    assert "run r1 failed" in text and "run_id=r1" in text


def test_text_lines_escape_control_characters_in_the_message_and_the_extra_fields() -> None:
    hostile = "r1\n2026-01-01 00:00:00,000 INFO    ductor: forged\x1b[31m red\x00 nul\r\t\x7f\x9b"
    record = logging.LogRecord(
        "ductor.test", logging.WARNING, __file__, 1, "run %s failed", (hostile,), None
    )
    record.__dict__.update({"run_id": hostile, "key\nforged": "v\x1b[0m"})
    text = TextFormatter().format(record)
    assert "\n" not in text and "\r" not in text and "\x1b" not in text and "\x00" not in text
    assert "\x7f" not in text and "\x9b" not in text
    escaped = r"r1\n2026-01-01 00:00:00,000 INFO    ductor: forged\x1b[31m red\x00 nul\r\t\x7f\x9b"
    assert f"run {escaped} failed" in text
    assert f"run_id={escaped}" in text
    assert r"key\nforged=v\x1b[0m" in text


def test_text_tracebacks_keep_their_lines_indented_and_escaped() -> None:
    try:
        raise ValueError("bad\nforged line\x1b[2J")
    except ValueError:
        record = logging.LogRecord(
            "ductor.test", logging.ERROR, __file__, 1, "failed", (), sys.exc_info()
        )
    lines = TextFormatter().format(record).split("\n")
    assert lines[0].endswith("ductor.test: failed")
    assert len(lines) > 2 and all(line.startswith("  ") for line in lines[1:])
    assert "  forged line\\x1b[2J" in lines


@pytest.mark.parametrize(
    ("raw", "escaped"),
    [("a\nb", r"a\nb"), ("\x1b[31m", r"\x1b[31m"), ("\x00", r"\x00"), ("é ✓", "é ✓")],
)
def test_escape_control(raw: str, escaped: str) -> None:
    assert escape_control(raw) == escaped
