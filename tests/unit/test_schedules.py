"""Schedules without services: cron expressions in a zone (core/cron.py) and the sweep's plan
for a due schedule (core/schedules.py): on-time fires, missed fires skipped or caught up,
the next fire, the run ids; Hypothesis properties that a fire is planned once however the
sweeps fall, and that a fire's run id is one run however many instances plan it."""

from __future__ import annotations

from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.core.cron import Cron, iso_utc
from processor.core.schedules import (
    MISSED_COUNT_LIMIT,
    ON_TIME_MS,
    check_catch_up,
    check_schedule_name,
    fire_run_id,
    manual_run_id,
    plan_fires,
)
from processor.core.workflow_def import ValidationError
from processor.io.runtime.zones import zone_named


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def test_fire_times_follow_the_expression_in_its_zone() -> None:
    nightly = Cron("30 2 * * *", zone_named("Europe/Berlin"))
    # 02:30 in Berlin is 01:30 UTC in winter.
    assert nightly.next_after(ms("2026-12-04T00:00:00+00:00")) == ms("2026-12-04T01:30:00+00:00")
    assert nightly.previous_before(ms("2026-12-04T01:30:00+00:00")) == ms(
        "2026-12-03T01:30:00+00:00"
    )
    # The spring-forward night has no 02:30 in Berlin: it fires right after the jump.
    assert nightly.next_after(ms("2026-03-28T12:00:00+00:00")) == ms("2026-03-29T01:00:00+00:00")
    every_10_s = Cron("* * * * *", seconds="*/10")
    assert every_10_s.next_after(ms("2026-12-04T10:00:03+00:00")) == ms("2026-12-04T10:00:10+00:00")
    assert Cron("@hourly").next_after(ms("2026-12-04T10:00:00+00:00")) == ms(
        "2026-12-04T11:00:00+00:00"
    )
    # On a fire time: strictly after it, strictly before it.
    assert every_10_s.next_after(ms("2026-12-04T10:00:10+00:00")) == ms("2026-12-04T10:00:20+00:00")


@pytest.mark.parametrize(
    ("expression", "tz", "message"),
    [
        ("* * * *", "UTC", "expected five fields"),
        ("* * * * * * *", "UTC", "expected five fields"),
        ("* * * * * *", "UTC", "has six fields"),
        ("R * * * *", "UTC", "R \\(random\\) and H \\(hashed\\)"),
        ("0 r(0-5) * * *", "UTC", "R \\(random\\)"),
        ("H * * * *", "UTC", "R \\(random\\) and H \\(hashed\\)"),
        ("61 * * * *", "UTC", "is not a valid cron expression"),
        ("bogus * * * *", "UTC", "is not a valid cron expression"),
        ("0 0 * * *", "Mars/Olympus", "time zone 'Mars/Olympus' is not one of the IANA"),
    ],
)
def test_what_is_not_a_schedule_is_refused(expression: str, tz: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Cron(expression, zone_named(tz))


def test_six_fields_are_refused_with_both_readings_written_apart() -> None:
    """`*/10 * * * * *`, meant as every ten seconds (seconds first, as Quartz and Spring read
    it), fired every second when read with the seconds last: neither reading is guessed. The
    message spells both the way that cannot be misread, and the one the writer meant fires
    every ten seconds."""
    with pytest.raises(ValidationError) as refused:
        Cron("*/10 * * * * *")
    message = str(refused.value)
    first = "--cron '* * * * *' --seconds '*/10' (seconds first)"
    last = "--cron '*/10 * * * *' --seconds '*' (seconds last)"
    assert message.endswith(
        "write the five cron fields (minute hour day-of-month month day-of-week) and the"
        f" seconds apart: {first} or {last}"
    ), message
    meant = Cron("* * * * *", seconds="*/10")
    after = ms("2026-12-04T10:00:03+00:00")
    assert meant.following(meant.next_after(after), 3) == [
        ms(f"2026-12-04T10:00:{s}+00:00") for s in ("10", "20", "30")
    ]
    # A reading that is no cron expression (weekday 9) is left out of the message.
    with pytest.raises(ValidationError) as one_way:
        Cron("30 0 * * * 9")
    assert str(one_way.value).endswith("apart: --cron '30 0 * * *' --seconds '9' (seconds last)")


def test_seconds_are_a_field_of_their_own() -> None:
    half_past = Cron("0 6 * * *", zone_named("Europe/Berlin"), seconds="30")
    assert half_past.next_after(ms("2026-12-04T00:00:00+00:00")) == ms("2026-12-04T05:00:30+00:00")
    assert half_past.spelled() == "0 6 * * * --seconds 30"
    assert Cron("0 6 * * *").spelled() == "0 6 * * *"
    twice = Cron("*/5 * * * *", seconds="0,30")
    assert twice.following(ms("2026-12-04T10:05:00+00:00"), 3) == [
        ms("2026-12-04T10:05:00+00:00"),
        ms("2026-12-04T10:05:30+00:00"),
        ms("2026-12-04T10:10:00+00:00"),
    ]
    for bad in ("60", "*/0", "H", "R", "1 2", "L", ""):
        with pytest.raises(ValidationError, match="one cron field of 0-59"):
            Cron("* * * * *", seconds=bad)
    with pytest.raises(ValidationError, match="seconds go with five fields, not a @ name"):
        Cron("@daily", seconds="5")
    # Month and weekday names hold an R or an H: they are no random or hashed values.
    assert Cron("0 0 * MAR THU").next_after(0) > 0
    assert Cron("0 0 * * fri,thu").next_after(0) > 0


def test_the_next_fires_read_in_the_schedules_zone() -> None:
    """What `schedules create` prints: the fires in the zone the expression reads in, across
    a change of its offset."""
    morning = Cron("0 6 * * *", zone_named("Europe/Berlin"))
    first = morning.next_after(ms("2026-03-27T12:00:00+00:00"))
    assert [morning.local(f) for f in morning.following(first, 3)] == [
        "2026-03-28T06:00:00+01:00 Sat",
        "2026-03-29T06:00:00+02:00 Sun",
        "2026-03-30T06:00:00+02:00 Mon",
    ]
    assert Cron("* * * * *").local(ms("2026-12-04T10:00:00.250+00:00")) == (
        "2026-12-04T10:00:00.250+00:00 Fri"
    )


def test_names_run_ids_and_bounds() -> None:
    assert check_schedule_name("nightly-report.v2") == "nightly-report.v2"
    for bad in ("", "-x", "a b", "x" * 101, "a@b"):
        with pytest.raises(ValidationError):
            check_schedule_name(bad)
    assert fire_run_id("nightly", ms("2026-12-04T02:00:00+00:00")) == "nightly@2026-12-04T02:00:00Z"
    assert manual_run_id("nightly", ms("2026-12-04T02:00:00.250+00:00")) == (
        "nightly@manual-2026-12-04T02:00:00.250Z"
    )
    assert iso_utc(0) == "1970-01-01T00:00:00Z"
    with pytest.raises(ValidationError):
        check_catch_up(-1)


MINUTELY = Cron("* * * * *")
NOW = ms("2026-12-04T10:00:30+00:00")


def test_a_schedule_not_due_plans_nothing() -> None:
    plan = plan_fires(MINUTELY, NOW + 30_000, NOW, catch_up=0)
    assert plan == (((), 0, NOW + 30_000))


def test_a_fire_on_time_starts_its_run_and_the_next_is_after_now() -> None:
    due = ms("2026-12-04T10:00:00+00:00")
    plan = plan_fires(MINUTELY, due, NOW, catch_up=0)
    assert plan.fires == (due,) and plan.missed == 0
    assert plan.next_fire_ms == ms("2026-12-04T10:01:00+00:00")


def test_fires_missed_in_an_outage_are_skipped_or_the_latest_caught_up() -> None:
    since = ms("2026-12-04T09:50:00+00:00")  # ten minutes of fires owed, one on time
    skipped = plan_fires(MINUTELY, since, NOW, catch_up=0)
    assert skipped.fires == (ms("2026-12-04T10:00:00+00:00"),)
    assert skipped.missed == 10
    caught = plan_fires(MINUTELY, since, NOW, catch_up=3)
    assert caught.fires == tuple(
        ms(f"2026-12-04T{t}:00+00:00") for t in ("09:57", "09:58", "09:59", "10:00")
    )
    assert caught.missed == 7
    assert caught.next_fire_ms == skipped.next_fire_ms == ms("2026-12-04T10:01:00+00:00")


def test_an_every_second_schedule_down_a_day_is_counted_not_walked_whole() -> None:
    every_second = Cron("* * * * *", seconds="*")
    plan = plan_fires(every_second, NOW - 86_400_000, NOW, catch_up=2)
    assert len(plan.fires) == ON_TIME_MS // 1000 + 1 + 2  # the minute on time, and two caught
    assert plan.missed == MISSED_COUNT_LIMIT
    assert plan.fires[:2] == (NOW - ON_TIME_MS - 2000, NOW - ON_TIME_MS - 1000)


@settings(max_examples=300, deadline=None)
@given(
    expression=st.sampled_from(
        [("* * * * *", "*/7"), ("*/5 * * * *", None), ("0 * * * *", None), ("* * * * *", "*")]
    ),
    catch_up=st.integers(0, 5),
    steps=st.lists(st.integers(1, 400_000), min_size=1, max_size=12),
)
def test_a_fire_is_planned_once_however_the_sweeps_fall(
    expression: tuple[str, str | None], catch_up: int, steps: list[int]
) -> None:
    """Sweeps at any times after one another: no fire is planned twice, every fire planned is
    one of the expression's, in order, and every fire that came on time at some sweep (no
    later than ON_TIME_MS before it) was planned."""
    cron = Cron(expression[0], seconds=expression[1])
    start = ms("2026-12-04T10:00:00+00:00")
    next_fire = cron.next_after(start)
    now = start
    planned: list[int] = []
    for step in steps:
        now += step
        plan = plan_fires(cron, next_fire, now, catch_up)
        assert all(f <= now for f in plan.fires) and plan.next_fire_ms > now
        fire, on_time = next_fire, []
        while fire <= now:
            if fire >= now - ON_TIME_MS:
                on_time.append(fire)
            fire = cron.next_after(fire)
        assert set(on_time) <= set(plan.fires)
        assert list(plan.fires) == sorted(set(plan.fires))
        planned += plan.fires
        next_fire = plan.next_fire_ms
    assert len(planned) == len(set(planned))
    assert all(cron.next_after(f - 1) == f for f in planned)
    fire, expected = cron.next_after(start), []
    while fire <= now:
        expected.append(fire)
        fire = cron.next_after(fire)
    assert set(planned) <= set(expected)


@given(st.integers(0, 4_102_444_800_000), st.sampled_from(["nightly", "a.b-c_1"]))
def test_a_fires_run_id_is_the_same_wherever_it_is_planned(fire: int, name: str) -> None:
    assert fire_run_id(name, fire) == fire_run_id(name, fire)
    assert fire_run_id(name, fire) != fire_run_id(name, fire + 1000)
    assert fire_run_id(name, fire).startswith(f"{name}@")
