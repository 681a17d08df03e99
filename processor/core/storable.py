"""What Postgres can store of a JSON-like value: text and jsonb refuse the NUL character, so
every value from the wire or from a step is checked for it before it reaches a row."""

from __future__ import annotations

from typing import Any


def holds_nul(value: Any) -> bool:
    """Whether a JSON-like value holds a NUL character in a string or a key (jsonb refuses)."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(holds_nul(k) or holds_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(holds_nul(v) for v in value)
    return False
