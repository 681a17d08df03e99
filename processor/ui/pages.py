"""The pages' HTML: Jinja2 templates shipped in the package (processor/ui/templates), every
value escaped (autoescape on for every template, and an undefined name is an error rather than
an empty string), and the few filters the templates use to show times and ids."""

from __future__ import annotations

from datetime import UTC, datetime
from importlib import resources
from typing import Any
from urllib.parse import quote, urlencode

import orjson
from jinja2 import Environment, PackageLoader, StrictUndefined

# Shown whole on the run page up to this many characters; `ductor result` prints any output.
OUTPUT_CHARS = 20_000
# A dead letter's key or value in its table cell: its first bytes (`ductor dlq list -o json`
# gives them all). Not UTF-8, they are shown in hex: a cell holds this many of them.
BYTES_SHOWN = 80
HEX_SHOWN = 24


def environment() -> Environment:
    env = Environment(
        loader=PackageLoader("processor.ui", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = when
    env.filters["run_url"] = run_url
    env.filters["workflow_url"] = workflow_url
    env.filters["pretty_json"] = pretty_json
    env.filters["seconds"] = seconds
    env.filters["shown_json"] = shown_json
    env.filters["raw_bytes"] = raw_bytes
    env.globals["query"] = query
    return env


def stylesheet() -> bytes:
    return resources.files("processor.ui").joinpath("static/ui.css").read_bytes()


def script() -> bytes:
    return resources.files("processor.ui").joinpath("static/ui.js").read_bytes()


def when(value: datetime | str | None) -> str:
    """A time as UTC to the second (``2026-05-01 12:00:03``), ``-`` for none."""
    if value is None:
        return "-"
    at = datetime.fromisoformat(value) if isinstance(value, str) else value
    if at.tzinfo is not None:
        at = at.astimezone(UTC)
    return at.strftime("%Y-%m-%d %H:%M:%S")


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"


def run_url(run_id: str) -> str:
    """The run page's path: the id quoted whole (a child run's id holds '/' and '#')."""
    return "/runs/" + quote(run_id, safe="")


def workflow_url(name: str, version: int) -> str:
    """A registered version's page: the name quoted whole."""
    return f"/workflows/{quote(name, safe='')}/{version}"


def pretty_json(value: Any) -> str:
    text = orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
    if len(text) <= OUTPUT_CHARS:
        return text
    return f"{text[:OUTPUT_CHARS]}\n... ({len(text)} characters; `ductor result` prints it whole)"


def shown_json(shown: dict[str, Any] | None) -> str:
    """A value as `inspect -o json` gives it (core/shown.py): indented JSON when it is whole,
    else the start of its JSON text (the page says it was cut)."""
    if shown is None:
        return "-"
    if shown["truncated"]:
        return str(shown["preview"])
    return pretty_json(shown["value"])


def query(pairs: list[tuple[str, str]], **changes: str) -> str:
    """``?a=1&b=2``: the pairs with each name in ``changes`` set to its value alone."""
    kept = [(k, v) for k, v in pairs if k not in changes]
    return "?" + urlencode([*kept, *changes.items()])


def raw_bytes(raw: bytes | None) -> str:
    """A record's key or value as a table cell shows it: UTF-8 text as text, its control
    characters escaped (``\\n``, ``\\x00``), at most BYTES_SHOWN characters; anything else
    as ``hex 8f 00 ff ...``, at most HEX_SHOWN bytes; either way with its length when cut.
    (The stylesheet wraps it anywhere: a long unbroken string cannot widen the table.)"""
    if raw is None:
        return "(null)"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        shown = " ".join(f"{b:02x}" for b in raw[:HEX_SHOWN])
        more = f" … ({len(raw)} bytes)" if len(raw) > HEX_SHOWN else ""
        return f"hex {shown}{more} (not UTF-8)"
    escaped = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:BYTES_SHOWN])
    return escaped + (f" … ({len(raw)} bytes)" if len(text) > BYTES_SHOWN else "")
