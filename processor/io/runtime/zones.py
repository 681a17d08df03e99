"""Time zones by their IANA names, read from the zone database (the system's, or the tzdata
package where it has none): the shell's lookup, so that the core's calendar arithmetic
(core/cron.py) is handed a zone and reads no file."""

from __future__ import annotations

from datetime import UTC, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from processor.core.workflow_def import ValidationError


def zone_named(tz: str) -> tzinfo:
    """The zone ``tz`` names (``UTC``, ``Europe/Berlin``); ValidationError, saying what to
    write, for a name the database does not hold."""
    if tz == "UTC":
        return UTC
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValidationError(
            f"time zone {tz!r} is not one of the IANA database's (e.g. UTC, Europe/Berlin)"
        ) from None
