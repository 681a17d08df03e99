"""Structured logging: JSON lines by default, human-readable text with DUCTOR_LOG_FORMAT=text.

Fields passed with ``extra=`` become JSON keys; the active trace and span ids are added when a
span is recording, so a log line can be found from its trace and the other way round.

Text lines escape control characters in the message and the extra fields (a newline as
``\\n``, ESC as ``\\x1b``...): what a record carries (a run id, a header, an error from
elsewhere) can neither forge a log line of its own nor drive the terminal. A traceback keeps its
line breaks but every line of it is indented, so none of them can pass for a record either.
JSON lines need none of this: the encoder escapes every control character.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from opentelemetry import trace


def first_line(exc: BaseException) -> str:
    """What a log line or a message says of an error: the first line of its text, or its class
    name when it has none (a database error's text runs on with hints and context)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def describe(exc: BaseException) -> str:
    """What a log line or a dead letter says of an exception nobody foresaw: its type and the
    first line of its text."""
    return f"{type(exc).__name__}: {first_line(exc)}"


_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            body["trace_id"] = f"{span.trace_id:032x}"
            body["span_id"] = f"{span.span_id:016x}"
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                body[key] = value
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(body, default=str).decode()


# C0 controls, DEL, C1 controls, and the Unicode line and paragraph separators.
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}
_CONTROL |= {0x2028: "\\u2028", 0x2029: "\\u2029"}
_CONTROL |= {ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"}
_CONTROL_BUT_NEWLINE = {c: e for c, e in _CONTROL.items() if c != ord("\n")}


def escape_control(text: str) -> str:
    """``text`` with every control character written as an escape sequence (one line)."""
    return text.translate(_CONTROL)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        record.message = escape_control(record.getMessage())
        record.asctime = self.formatTime(record, self.datefmt)
        line = self.formatMessage(record)
        extras = {
            k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")
        }
        if extras:
            line += " " + " ".join(
                f"{escape_control(k)}={escape_control(str(v))}" for k, v in extras.items()
            )
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        for block in (record.exc_text, record.stack_info and self.formatStack(record.stack_info)):
            if block:
                line += "".join(
                    "\n  " + part.translate(_CONTROL_BUT_NEWLINE) for part in block.split("\n")
                )
        return line


# The name of the handler ``setup_logging`` installs (tests remove it after a command they ran
# in process: its stream is then pytest's closed capture).
HANDLER_NAME = "ductor"


def setup_logging(fmt: str = "json", level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(HANDLER_NAME)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def read_stats(path: Path, final: bool = False) -> dict[str, Any] | None:
    """The newest stats a processor logged to ``path`` (JSON lines): from its periodic
    ``processor stats`` lines, or with ``final`` only from its ``processor stopped`` line."""
    for raw in reversed(path.read_bytes().splitlines()):
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue  # not a log line (a failing command's last sentence)
        if "stats" in line and (not final or line.get("msg") == "processor stopped"):
            stats: dict[str, Any] = line["stats"]
            return stats
    return None
