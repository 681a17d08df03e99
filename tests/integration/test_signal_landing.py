"""A signal goes where it can land (core/landing.py): `ductor signal`, the client, the requests
topic and the triggers refuse a signal to a run that has ended, or named as no wait step of
the run's workflow waits for (a typo), and `cancel` lands on every live run. On the command
line that is exit 2 with the reason, in the client ``SignalRefused``, on a topic one dead
letter per bad record (``run_ended``, ``unknown_signal``) with its bytes. A kept signal (read
before its run existed) is judged when its run appears, by the start that takes it or the
sweep that adopts it (a child run's); a signal whose run ends while it is being recorded is
refused, not recorded for a run that can no longer read it."""

from __future__ import annotations

import threading
import uuid
from collections import defaultdict
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from processor.client import SignalRefused, send_signal, start_run
from processor.core.outcomes import DeadLetterReason
from processor.core.requests import SignalRequest, StartRequest
from processor.core.routing import TopicNames, run_shard
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.kafka.dlq import DeadLetter, read_dead_letters
from processor.io.postgres.workflows import register_workflow
from processor.io.runtime.faults import Faults, Point

from .children import run_ductor
from .runs import run_statuses
from .test_requests_intake import _kept, _write
from .test_triggers import _create, _events, _team_topic
from .waiting import wait_for

pytestmark = pytest.mark.integration

TAG = uuid.uuid4().hex[:8]
NAME, CHILD_NAME, PARENT_NAME = f"approval-{TAG}", f"approval-child-{TAG}", f"holder-{TAG}"
# No worker runs any of these: a run waits at its wait step until a signal ends it.
APPROVAL = {
    "name": NAME,
    "version": 1,
    "steps": [{"name": "approve", "kind": "wait", "signal": "approved"}],
    "output": "approve",
}
CHILD = {**APPROVAL, "name": CHILD_NAME}
PARENT = {
    "name": PARENT_NAME,
    "version": 1,
    "steps": [{"name": "hold", "kind": "workflow", "workflow": CHILD_NAME}],
}


@pytest.fixture(autouse=True)
def _workflows(pg: psycopg.Connection[Any]) -> None:
    for wf in (APPROVAL, CHILD, PARENT):
        register_workflow(pg, parse_workflow(wf))


def _signal(run_id: str, name: str, signal_id: str, payload: Any = None) -> tuple[str, bytes]:
    return run_id, SignalRequest(run_id, name, signal_id, payload).encode()


def _start(run_id: str, workflow: str = NAME) -> tuple[str, bytes]:
    return run_id, StartRequest(run_id, workflow).encode()


def _signals(pg: psycopg.Connection[Any]) -> dict[str, list[str]]:
    """The signal ids recorded, by run."""
    found: dict[str, list[str]] = defaultdict(list)
    for run_id, signal_id in pg.execute(
        "SELECT run_id, signal_id FROM eec_run_signal ORDER BY run_id, signal_id"
    ):
        found[run_id].append(signal_id)
    return dict(found)


def _letters(settings: Settings) -> dict[str, list[DeadLetter]]:
    by_reason: dict[str, list[DeadLetter]] = defaultdict(list)
    for letter in read_dead_letters(settings):
        assert letter.copies == 1, f"{letter.reason} dead-lettered {letter.copies} times"
        by_reason[letter.reason].append(letter)
    return dict(by_reason)


def _ended(settings: Settings, pg: psycopg.Connection[Any], run_id: str) -> None:
    """Start a run and cancel it: a run that has ended."""
    start_run(settings, NAME, run_id)
    send_signal(settings, run_id, "cancel", signal_id=f"end-{run_id}")
    wait_for(lambda: run_statuses(pg, [run_id]) == {run_id: "cancelled"}, 60, f"{run_id} ended")


def test_ductor_signal_and_the_client_refuse_a_typo_and_a_run_that_has_ended(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    processor_thread(settings)
    start_run(settings, NAME, "cli-1")
    start_run(settings, NAME, "cli-2")
    typo = run_ductor(settings, "signal", "cli-1", "aproved", "--payload", '{"by": "ada"}')
    assert typo.returncode == 2, typo.stderr
    assert typo.stderr.strip() == (
        "ductor: signal 'aproved' refused (unknown_signal): no step of workflow"
        f" '{NAME}' version 1 waits for a signal named 'aproved'; it waits for"
        " 'approved' (or 'cancel')"
    )
    with pytest.raises(SignalRefused) as refused:
        send_signal(settings, "cli-2", "aproved")
    assert refused.value.reason is DeadLetterReason.UNKNOWN_SIGNAL
    assert _signals(pg) == {}, "a refused signal was written"
    sent = run_ductor(
        settings, "signal", "cli-1", "approved", "--payload", '{"by": "ada"}', "--signal-id", "ok"
    )
    assert sent.returncode == 0, sent.stderr
    wait_for(lambda: run_statuses(pg, ["cli-1"]) == {"cli-1": "succeeded"}, 60, "cli-1 approved")
    # The run has ended: nothing lands on it any more, not even a cancel...
    for name in ("approved", "cancel"):
        late = run_ductor(settings, "signal", "cli-1", name)
        assert late.returncode == 2, late.stderr
        assert late.stderr.strip() == (
            f"ductor: signal '{name}' refused (run_ended): run 'cli-1' has ended (succeeded):"
            " a signal can change it no more"
        )
    cancel = run_ductor(settings, "runs", "cancel", "cli-1")
    assert cancel.returncode == 2 and "(run_ended)" in cancel.stderr, cancel.stderr
    with pytest.raises(SignalRefused) as ended:
        send_signal(settings, "cli-1", "cancel")
    assert ended.value.reason is DeadLetterReason.RUN_ENDED
    # ...but the signal that ended it, sent again (a retry), is answered as before.
    again = run_ductor(settings, "signal", "cli-1", "approved", "--signal-id", "ok")
    assert again.returncode == 0 and "was already recorded (ok)" in again.stdout, again.stderr
    # `cancel` lands on any live run, whatever its workflow waits for.
    assert run_ductor(settings, "signal", "cli-2", "cancel").returncode == 0
    wait_for(lambda: run_statuses(pg, ["cli-2"]) == {"cli-2": "cancelled"}, 60, "cli-2 cancelled")
    assert {r: len(s) for r, s in _signals(pg).items()} == {"cli-1": 1, "cli-2": 1}
    missing = run_ductor(settings, "signal", "no-such-run", "cancel")
    assert missing.returncode == 1 and "no run with id" in missing.stderr, missing.stderr


def test_bad_signals_from_kafka_are_one_dead_letter_each_with_the_reason(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """Through the requests topic (kcat) and a trigger: a typo to a live run, signals to a run
    that has ended, a typo kept before its run's start and refused by that start, a cancel kept
    beside a run that then ended and refused by the sweep; each one dead letter with its
    bytes, while the good signals beside them land."""
    settings = replace(settings, trigger_refresh_s=0.5)
    instance = processor_thread(settings)
    requests = TopicNames(settings.topic_prefix).requests
    approvals = _team_topic(settings, "approvals", partitions=1)
    _create(
        settings, "approvals-in", "--topic", approvals, "--signal", "aproved",
        "--run-id", "$.order", "--run-id-prefix", "kfk-",
    )  # fmt: skip
    wait_for(
        lambda: any(tp[0] == approvals for tp in instance.processor.assigned),
        30,
        "the instance to follow the trigger",
    )
    start_run(settings, NAME, "kfk-live")
    _ended(settings, pg, "kfk-done")
    bad = {
        "typo": _signal("kfk-live", "aproved", "sig-typo", {"by": "ada"}),
        "late-cancel": _signal("kfk-done", "cancel", "sig-late-cancel"),
        "late-approval": _signal("kfk-done", "approved", "sig-late-approval"),
        "early-typo": _signal("kfk-early", "aproved", "sig-early-typo"),
    }
    _write(
        settings,
        [
            *bad.values(),
            _signal("kfk-early", "approved", "sig-early-ok", {"by": "bob"}),  # kept, then taken
            _signal("kfk-live", "approved", "sig-ok", {"by": "ada"}),
        ],
    )
    wait_for(lambda: _kept(pg) == ["kfk-early", "kfk-early"], 30, "the early signals to be kept")
    _write(settings, [_start("kfk-early")])
    _events(settings, approvals, 0, [{"order": "live"}])  # the trigger's typo: for a live run
    # The leftover of a race: a cancel kept beside a run that then ended, for the sweep.
    pg.execute(
        "INSERT INTO eec_kept_signal (run_id, signal_id, kind, shard, record_key, record_value,"
        " source_topic, source_partition, source_offset)"
        " VALUES ('kfk-done', 'sig-race', 'cancel', %s, 'kfk-done', '\\x7b7d', %s, 0, 999)",
        (run_shard("kfk-done"), requests),
    )
    wait_for(
        lambda: (
            run_statuses(pg, ["kfk-live", "kfk-early"])
            == {"kfk-live": "succeeded", "kfk-early": "succeeded"}
        ),
        60,
        "the good signals to land",
    )
    wait_for(lambda: _kept(pg) == [], 30, "the kept signals to be taken or dead-lettered")
    wait_for(lambda: len(read_dead_letters(settings)) == 6, 30, "six dead letters")
    letters = _letters(settings)
    assert sorted(letters) == ["run_ended", "unknown_signal"]
    values = {(letter.reason, letter.value) for letter in letters["run_ended"]}
    assert values == {
        ("run_ended", bad["late-cancel"][1]),
        ("run_ended", bad["late-approval"][1]),
        ("run_ended", b"{}"),
    }
    by_topic = {(letter.source_topic, letter.value) for letter in letters["unknown_signal"]}
    assert by_topic == {
        (requests, bad["typo"][1]),
        (requests, bad["early-typo"][1]),
        (approvals, b'{"order":"live"}'),
    }
    for letter in letters["unknown_signal"]:
        assert "waits for a signal named 'aproved'" in letter.detail, letter.detail
    outputs = dict(pg.execute("SELECT run_id, output FROM eec_workflow_run WHERE output <> 'null'"))
    assert outputs == {"kfk-live": {"by": "ada"}, "kfk-early": {"by": "bob"}}
    assert _signals(pg) == {
        "kfk-done": ["end-kfk-done"],
        "kfk-early": ["sig-early-ok"],
        "kfk-live": ["sig-ok"],
    }


def test_a_signal_whose_run_ends_while_it_is_recorded_is_refused(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """The request statement read the run live; before it records the signal, the run is
    cancelled and its cancel committed (fault point ``signals_read``): the signal is a
    ``run_ended`` dead letter, not a row the ended run never reads."""
    ended = threading.Event()

    def cancel_meanwhile(run_ids: list[str]) -> None:
        if "race-1" in run_ids and not ended.is_set():
            send_signal(settings, "race-1", "cancel", signal_id="race-cancel")
            wait_for(lambda: run_statuses(pg, ["race-1"]) == {"race-1": "cancelled"}, 60, "ended")
            ended.set()

    processor_thread(settings, faults=Faults({Point.SIGNALS_READ: cancel_meanwhile}))
    start_run(settings, NAME, "race-1")
    record = _signal("race-1", "approved", "sig-racing", {"by": "ada"})
    _write(settings, [record])
    wait_for(lambda: len(read_dead_letters(settings)) == 1, 60, "the racing signal's dead letter")
    assert ended.is_set()
    [letter] = read_dead_letters(settings)
    assert (letter.reason, letter.value) == ("run_ended", record[1])
    assert "run 'race-1' has ended (cancelled)" in letter.detail
    assert _signals(pg) == {"race-1": ["race-cancel"]}


def test_signals_kept_for_a_child_run_are_judged_when_the_sweep_adopts_them(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """Signals for a child run, read before its parent started it (kept): the one its
    workflow waits for ends its wait step when a sweep adopts it, the typo is dead-lettered."""
    child = "kid-1/hold#1"
    processor_thread(settings)
    good = _signal(child, "approved", "sig-child-ok", {"by": "carol"})
    typo = _signal(child, "approve", "sig-child-typo")
    _write(settings, [good, typo])
    wait_for(lambda: _kept(pg) == [child, child], 30, "the child's signals to be kept")
    _write(settings, [_start("kid-1", PARENT_NAME)])
    wait_for(
        lambda: run_statuses(pg, ["kid-1", child]) == {"kid-1": "succeeded", child: "succeeded"},
        60,
        "the parent to end with its child",
    )
    wait_for(lambda: _kept(pg) == [], 30, "the typo to be dead-lettered")
    [letter] = read_dead_letters(settings)
    assert (letter.reason, letter.key, letter.value) == ("unknown_signal", child.encode(), typo[1])
    assert _signals(pg) == {child: ["sig-child-ok"]}
    output = pg.execute("SELECT output FROM eec_workflow_run WHERE run_id = %s", (child,))
    assert output.fetchone() == ({"by": "carol"},)


def test_a_workflow_without_wait_steps_takes_only_cancel(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """The sample workflow waits for no signal: any name but cancel is refused (before, an
    'approved' to it was recorded and changed nothing)."""
    processor_thread(settings)
    start_run(settings, "sample", "plain-1")
    typo = run_ductor(settings, "signal", "plain-1", "approved")
    assert typo.returncode == 2, typo.stderr
    assert "it has no wait step: only 'cancel' can be sent to its runs" in typo.stderr
    assert run_ductor(settings, "signal", "plain-1", "cancel").returncode == 0
    wait_for(lambda: run_statuses(pg, ["plain-1"]) == {"plain-1": "cancelled"}, 60, "cancelled")
    assert {r: len(s) for r, s in _signals(pg).items()} == {"plain-1": 1}
