"""Structured logs: JSON lines with the fields passed as extras, trace ids from a span."""

from __future__ import annotations

import logging

import orjson
from opentelemetry.sdk.trace import TracerProvider

from processor.io.logs import JsonFormatter, TextFormatter
from processor.io.telemetry import log_ids


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
