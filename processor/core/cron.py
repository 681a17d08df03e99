"""Cron expressions in a time zone, over epoch milliseconds: parsed and stepped by croniter
(a well-kept parser: day-of-week and day-of-month rules, names, ``@daily`` and the like, and
daylight-saving changes as Vixie cron handles them: a time the clocks skip fires right after
the jump, a time they repeat fires once), in the zone's own calendar from the IANA database
(zoneinfo; the tzdata package where the system has none).

Five fields (minute hour day-of-month month day-of-week), or six with seconds last
(``* * * * * */10``: every ten seconds). Calendar arithmetic only: the clock is never read
here, times come in as arguments.
"""

from __future__ import annotations

from datetime import UTC, datetime  # noqa: TID251 (calendar arithmetic; no clock is read)
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from processor.core.workflow import ValidationError


class Cron:
    """A cron expression in a time zone: its fire times around a given time."""

    def __init__(self, expression: str, tz: str = "UTC") -> None:
        fields = expression.split()
        if not (len(fields) in (5, 6) or (len(fields) == 1 and expression.startswith("@"))):
            raise ValidationError(
                f"cron {expression!r}: expected five fields (minute hour day-of-month month"
                " day-of-week), six with seconds last, or @hourly/@daily/@weekly/@monthly/@yearly"
            )
        try:
            self._zone = ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValidationError(
                f"time zone {tz!r} is not one of the IANA database's (e.g. UTC, Europe/Berlin)"
            ) from None
        if not croniter.is_valid(expression):
            raise ValidationError(f"cron {expression!r} is not a valid cron expression")
        self.expression = " ".join(fields)
        self.tz = tz
        try:  # (is_valid accepts a few that fail when stepped: 31 February)
            self.next_after(0)
        except (CroniterError, ValueError) as exc:
            raise ValidationError(f"cron {expression!r}: {exc}") from None

    def next_after(self, after_ms: int) -> int:
        """The first fire time strictly after ``after_ms`` (epoch ms)."""
        it = croniter(self.expression, self._at(after_ms))
        return _ms(it.get_next(datetime))

    def previous_before(self, before_ms: int) -> int:
        """The last fire time strictly before ``before_ms``."""
        it = croniter(self.expression, self._at(before_ms))
        return _ms(it.get_prev(datetime))

    def _at(self, ms: int) -> datetime:
        return datetime.fromtimestamp(ms / 1000, tz=UTC).astimezone(self._zone)

    def __repr__(self) -> str:
        return f"Cron({self.expression!r}, tz={self.tz!r})"


def _ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


def iso_utc(ms: int) -> str:
    """``ms`` as ISO 8601 in UTC, to the second when it is a whole one
    (``2026-12-04T10:15:00Z``), else to the millisecond."""
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    spec = "seconds" if ms % 1000 == 0 else "milliseconds"
    return moment.isoformat(timespec=spec).replace("+00:00", "Z")
