"""Trust at the intake (docs/requests.md#who-may-do-what): the requests topic does only what
the operator's scope allows (``DUCTOR_REQUESTS_*``), and a trigger only what its definition
says. A producer of the requests topic writes, with kcat, starts and signals inside and
outside the scope: those inside are honoured, each one outside is one ``not_allowed`` dead
letter with its bytes and the reason, and nothing of it reaches a run (a forged approval
leaves its wait step waiting, a forged cancel of a run outside the prefixes cancels
nothing). A signal trigger without a run-id prefix is refused at `ductor triggers create`
(exit 2), and one stored without (from before that rule) is not followed."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import orjson
import psycopg
import pytest

from processor.core.requests import SignalRequest, StartRequest
from processor.core.routing import TopicNames
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.kafka.dlq import read_dead_letters
from processor.io.postgres.workflows import register_workflow

from .children import run_ductor
from .runs import run_statuses
from .test_requests_intake import _signals, _write
from .test_triggers import _create, _team_topic
from .waiting import wait_for

pytestmark = pytest.mark.integration

# A run of it waits for its approval: no worker needed, and a forged approval would end it.
GATED_NAME = f"gated-{uuid.uuid4().hex[:8]}"
GATED = {
    "name": GATED_NAME,
    "version": 1,
    "steps": [{"name": "approval", "kind": "wait", "signal": "approved"}],
}


@pytest.fixture(autouse=True)
def _workflow(pg: psycopg.Connection[Any]) -> None:
    register_workflow(pg, parse_workflow(GATED))


def _start(run_id: str, workflow: str = GATED_NAME) -> tuple[str, bytes]:
    return run_id, StartRequest(run_id, workflow).encode()


def _signal(run_id: str, name: str, signal_id: str, payload: Any = None) -> tuple[str, bytes]:
    return run_id, SignalRequest(run_id, name, signal_id, payload).encode()


def _not_allowed(settings: Settings) -> dict[str, str]:
    """The requests topic's dead letters: run id -> reason: detail."""
    found = {}
    for letter in read_dead_letters(settings):
        assert letter.source_topic == TopicNames(settings.topic_prefix).requests
        detail = letter.header("ductor.dlq.detail") or ""
        found[(letter.key or b"").decode()] = f"{letter.reason}: {detail}"
    return found


def test_the_requests_topic_does_only_what_its_scope_allows(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    scoped = replace(
        settings,
        requests_workflows=(GATED_NAME,),
        requests_run_id_prefixes=("shop-",),
        requests_signals=("cancel",),
    )
    processor_thread(scoped)
    forged_approval = _signal("shop-1", "approved", "forged-1", {"amount": 1_000_000})
    _write(
        settings,
        [
            _start("shop-1"),
            _start("shop-2"),
            _start("bank-1"),  # outside the prefixes
            _start("shop-3", workflow="sample"),  # a workflow outside the scope
            _signal("shop-2", "cancel", "stop-2"),  # inside: it cancels
            _signal("bank-9", "cancel", "stop-9"),  # a run outside the prefixes
        ],
    )
    wait_for(
        lambda: run_statuses(pg, ["shop-2"]) == {"shop-2": "cancelled"}, 60, "shop-2 cancelled"
    )
    _write(settings, [forged_approval])  # after its run exists: it would end the wait
    wait_for(lambda: len(_not_allowed(settings)) == 4, 60, "four not_allowed dead letters")
    door = "the requests topic (DUCTOR_REQUESTS_*)"
    assert _not_allowed(settings) == {
        "bank-1": f"not_allowed: {door} may not start run 'bank-1': its run ids begin with 'shop-'",
        "shop-3": f"not_allowed: {door} may not start workflow 'sample': it may start"
        f" {GATED_NAME!r}",
        "bank-9": f"not_allowed: {door} may not signal run 'bank-9': its run ids begin with"
        " 'shop-'",
        "shop-1": f"not_allowed: {door} may not send signal 'approved': it may send 'cancel'",
    }
    [letter] = [x for x in read_dead_letters(settings) if x.key == b"shop-1"]
    assert letter.value == forged_approval[1]  # the record itself, for a replay elsewhere
    assert run_statuses(pg, ["shop-1", "shop-2", "bank-1", "shop-3"]) == {
        "shop-1": "running",
        "shop-2": "cancelled",
    }
    assert _signals(pg, ["shop-1", "bank-9"]) == {}
    assert pg.execute("SELECT count(*) FROM eec_kept_signal").fetchone() == (0,)
    # The database's door is not the topic's: an operator's approval goes through.
    done = run_ductor(settings, "signal", "shop-1", "approved", "--payload", '{"by": "ops"}')
    assert done.returncode == 0, done.stderr
    wait_for(lambda: run_statuses(pg, ["shop-1"]) == {"shop-1": "succeeded"}, 60, "shop-1 approved")


def test_a_signal_trigger_reaches_only_the_runs_under_its_prefix(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    settings = replace(settings, trigger_refresh_s=0.5)
    unscoped_topic = _team_topic(settings, "cancels-anything")
    refused = run_ductor(
        settings, "triggers", "create", "cancel-anything", "--topic", unscoped_topic,
        "--signal", "cancel", "--run-id", "$.run",
    )  # fmt: skip
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "a signal trigger needs a run-id prefix (--run-id-prefix)" in refused.stderr
    # One stored without a prefix, as a version before this rule stored it.
    pg.execute(
        "INSERT INTO eec_trigger (name, source_topic, definition, start_offsets)"
        " VALUES ('cancel-anything', %s, %s, '{}')",
        (
            unscoped_topic,
            orjson.dumps(
                {
                    "trigger_version": 1,
                    "topic": unscoped_topic,
                    "action": "signal",
                    "run_id": "$.run",
                    "input": "$",
                    "signal": "cancel",
                }
            ).decode(),
        ),
    )
    scoped_topic = _team_topic(settings, "cancels-orders")
    _create(
        settings, "cancels-in", "--topic", scoped_topic, "--signal", "cancel",
        "--run-id", "$.run", "--run-id-prefix", "order-",
    )  # fmt: skip
    listed = run_ductor(settings, "triggers", "list").stdout
    assert "cancel-anything  UNREADABLE (a signal trigger needs a run-id prefix" in listed
    instance = processor_thread(settings)
    # Both are read together: once the scoped one's topic is followed, the other was left out.
    wait_for(
        lambda: any(tp[0] == scoped_topic for tp in instance.processor.assigned),
        60,
        "the scoped trigger's topic to be followed",
    )
    assert instance.processor.triggers.by_topic.keys() == {scoped_topic}
    assert not any(tp[0] == unscoped_topic for tp in instance.processor.assigned)
