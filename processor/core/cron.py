"""Cron expressions in a time zone, over epoch milliseconds: parsed and stepped by croniter
(a well-kept parser: day-of-week and day-of-month rules, names, ``@daily`` and the like, and
daylight-saving changes as Vixie cron handles them: a time the clocks skip fires right after
the jump, a time they repeat fires once), in the zone's own calendar (a ``tzinfo`` the shell
looked up by its IANA name: io/runtime/zones.py).

Five fields, as cron has them (minute hour day-of-month month day-of-week), or a ``@`` name.
Seconds are a field of their own (``seconds="*/10"``: every ten seconds of each minute the
five fields match), never a sixth field of the expression: six fields are read seconds last
by croniter and seconds first by Quartz and Spring, so ``*/10 * * * * *`` meant every ten
seconds to whoever wrote it and every second to croniter. Six fields are refused, with both
readings written the unambiguous way. So are croniter's random and hashed fields (``R``,
``H``): a fire time must be the same in every process that computes it.

Calendar arithmetic only: the clock is never read here, times come in as arguments, and
so does the zone (no file of the zone database is read here).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, tzinfo  # noqa: TID251 (calendar arithmetic; no clock is read)

from croniter import CroniterError, croniter

from processor.core.workflow_def import ValidationError

FIELDS = "minute hour day-of-month month day-of-week"
# A seconds field: numbers 0-59, `*`, ranges, lists and steps; nothing croniter would read
# as random or hashed.
_SECONDS = re.compile(r"[0-9*/,-]+")
# How to write a schedule with seconds, when neither reading of six fields is valid.
_GENERAL = "--cron 'MINUTE HOUR DAY MONTH WEEKDAY' --seconds 'SECONDS'"
# croniter's random (`R`, `R(0-30)`) and hashed (`H`) values: a letter on its own, not part of
# a month or weekday name (MAR, THU, FRI).
_NOT_THE_SAME_EVERYWHERE = re.compile(r"(?<![A-Za-z])[RH](?![A-Za-z])", re.IGNORECASE)


class Cron:
    """A cron expression in a time zone, with an optional seconds field: its fire times
    around a given time."""

    def __init__(self, expression: str, zone: tzinfo = UTC, seconds: str | None = None) -> None:
        fields = expression.split()
        if len(fields) == 6:
            raise ValidationError(six_fields(fields))
        named = len(fields) == 1 and expression.strip().startswith("@")
        if not (len(fields) == 5 or named):
            raise ValidationError(
                f"cron {expression!r}: expected five fields ({FIELDS}) or"
                " @hourly/@daily/@weekly/@monthly/@yearly; seconds go in a field of their own"
            )
        if _NOT_THE_SAME_EVERYWHERE.search(expression):
            raise ValidationError(
                f"cron {expression!r}: R (random) and H (hashed) values would fire at other"
                " times in each process that reads them: write the minute or hour you want"
            )
        if seconds is not None:
            _check_seconds(seconds, named)
        self._zone = zone
        self.expression = " ".join(fields)
        self.seconds = seconds
        self.tz = str(zone)  # its IANA name (a ZoneInfo's key; UTC's "UTC")
        # croniter's own order: the seconds last.
        self._croniter = self.expression if seconds is None else f"{self.expression} {seconds}"
        if not croniter.is_valid(self._croniter):
            raise ValidationError(f"cron {self.spelled()!r} is not a valid cron expression")
        try:  # (is_valid accepts a few that fail when stepped: 31 February)
            self.next_after(0)
        except (CroniterError, ValueError) as exc:
            raise ValidationError(f"cron {self.spelled()!r}: {exc}") from None

    def next_after(self, after_ms: int) -> int:
        """The first fire time strictly after ``after_ms`` (epoch ms)."""
        it = croniter(self._croniter, self._at(after_ms))
        return _ms(it.get_next(datetime))

    def previous_before(self, before_ms: int) -> int:
        """The last fire time strictly before ``before_ms``."""
        it = croniter(self._croniter, self._at(before_ms))
        return _ms(it.get_prev(datetime))

    def following(self, first_ms: int, count: int) -> list[int]:
        """``count`` fire times from ``first_ms`` (a fire time) on, ``first_ms`` included."""
        fires = [first_ms]
        while len(fires) < count:
            fires.append(self.next_after(fires[-1]))
        return fires[:count]

    def local(self, ms: int) -> str:
        """``ms`` as ISO 8601 in the expression's zone, with its offset and weekday
        (``2026-12-05T06:00:00+01:00 Sat``): the time as the expression reads it."""
        moment = self._at(ms)
        spec = "seconds" if ms % 1000 == 0 else "milliseconds"
        return f"{moment.isoformat(timespec=spec)} {moment.strftime('%a')}"

    def spelled(self) -> str:
        """The expression as `ductor schedules create` takes it: ``*/5 * * * *``, or
        ``* * * * * --seconds */10``."""
        return self.expression + ("" if self.seconds is None else f" --seconds {self.seconds}")

    def _at(self, ms: int) -> datetime:
        return datetime.fromtimestamp(ms / 1000, tz=UTC).astimezone(self._zone)

    def __repr__(self) -> str:
        return f"Cron({self.expression!r}, tz={self.tz!r}, seconds={self.seconds!r})"


def six_fields(fields: list[str]) -> str:
    """Why six fields are refused, and how to write each thing they may have meant."""
    readings = [
        (fields[1:], fields[0], "seconds first"),
        (fields[:5], fields[5], "seconds last"),
    ]
    ways = [
        f"--cron '{' '.join(rest)}' --seconds '{seconds}' ({which})"
        for rest, seconds, which in readings
        if _SECONDS.fullmatch(seconds) and croniter.is_valid(" ".join([*rest, seconds]))
    ]
    return (
        f"cron {' '.join(fields)!r} has six fields, which some read with the seconds first"
        f" (Quartz, Spring) and others last (croniter): write the five cron fields ({FIELDS})"
        f" and the seconds apart: {' or '.join(ways) if ways else _GENERAL}"
    )


def _check_seconds(seconds: str, named: bool) -> None:
    if named:
        raise ValidationError(
            "seconds go with five fields, not a @ name: write @hourly as '0 * * * *',"
            " @daily as '0 0 * * *'"
        )
    if not _SECONDS.fullmatch(seconds) or not croniter.is_valid(f"* * * * * {seconds}"):
        raise ValidationError(
            f"seconds {seconds!r}: one cron field of 0-59 (e.g. 0, */10, 15,45, 0-29/5)"
        )


def _ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


def iso_utc(ms: int) -> str:
    """``ms`` as ISO 8601 in UTC, to the second when it is a whole one
    (``2026-12-04T10:15:00Z``), else to the millisecond."""
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    spec = "seconds" if ms % 1000 == 0 else "milliseconds"
    return moment.isoformat(timespec=spec).replace("+00:00", "Z")
