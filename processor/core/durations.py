"""Durations as people write them in code: milliseconds (an int), a ``timedelta``, or text
(``"500ms"``, ``"15s"``, ``"10m"``, ``"2h"``, ``"1d"``), read as whole milliseconds: the
authoring API's timeouts (processor/authoring.py, which re-exports them) and the client's and
the CLI's delays. Pure: a duration is a length of time, no clock is read.
"""

from __future__ import annotations

import re
from datetime import timedelta  # noqa: TID251 (a duration's type; no clock is read)

from processor.core.workflow_def import ValidationError

Duration = int | str | timedelta

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def duration_ms(value: object, what: str = "duration") -> int:
    """``value`` (a ``Duration``) in whole milliseconds; ValidationError naming ``what`` when
    it is not a duration (a negative one included). It takes any object: a compiled build
    checks a typed argument before this could refuse it with a ValidationError."""
    if isinstance(value, bool):
        raise ValidationError(f"{what}: expected a duration, got {value!r}")
    if isinstance(value, int):
        ms = value
    elif isinstance(value, timedelta):
        ms = round(value.total_seconds() * 1000)
    elif isinstance(value, str) and (match := _DURATION.fullmatch(value)):
        ms = round(float(match.group(1)) * _UNIT_MS[match.group(2)])
    else:
        raise ValidationError(
            f"{what}: expected milliseconds, a timedelta or text such as '500ms', '15s', '10m',"
            f" '2h', '1d'; got {value!r}"
        )
    if ms < 0:
        raise ValidationError(f"{what}: must not be negative, got {value!r}")
    return ms


def optional_ms(value: object, what: str) -> int | None:
    """``duration_ms`` of an optional duration (None stays None)."""
    return None if value is None else duration_ms(value, what)
