"""The HTTP API of `ductor ui` (processor/ui/api.py) on a real server in this process, against
the real broker and database, with a processor and a step worker running: a start and its
result waited for, a signal that ends a waiting run, a cancel, a retry of a failed run, a
search, the bound on waits held at once; hostile bodies, a missing or wrong token and a
forged Host refused with nothing written; and the curl block of docs/usage.md#the-http-api
run as written.

Every answer any test gets is validated against the OpenAPI document the server serves
(openapi-core): its status must be one the operation documents, and its body must match that
status's schema."""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qsl, quote

import orjson
import psycopg
import pytest
from openapi_core import OpenAPI
from openapi_core.datatypes import RequestParameters
from openapi_spec_validator import validate
from werkzeug.datastructures import Headers, ImmutableMultiDict

from processor import client
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres.workflows import register_workflow
from processor.ui import api
from processor.ui.api_spec import openapi_document
from processor.ui.server import UiServer
from processor.worker.samples import sample_registry

from .instances import ProcessorThread, WorkerThread
from .samples import REPO
from .waiting import wait_for

pytestmark = pytest.mark.integration

TOKEN = f"api-token-{uuid.uuid4().hex}"
OPENAPI = OpenAPI.from_dict(openapi_document())
WORKFLOWS = (
    # echo's output holds the run's input: what a result shows came through.
    {"name": "echoes", "version": 1, "steps": [{"name": "e", "type": "echo"}], "output": "e"},
    # waits for `go`; its payload is the run's output.
    {
        "name": "gate",
        "version": 1,
        "steps": [{"name": "go", "kind": "wait", "signal": "go"}],
        "output": "go",
    },
    # flaky fails its first attempt (the worker's registry says one), which is its last.
    {
        "name": "once",
        "version": 1,
        "steps": [{"name": "f", "type": "flaky", "retry": {"max_attempts": 1}}],
        "output": "f",
    },
)


@dataclass
class _Request:
    """What openapi-core reads of a request to find its operation (its Request protocol)."""

    method: str
    path: str
    host_url: str = "http://127.0.0.1"
    content_type: str = "application/json"
    body: bytes | None = None
    parameters: RequestParameters = field(default_factory=RequestParameters)


@dataclass(frozen=True)
class _Response:
    status_code: int
    content_type: str
    headers: Headers
    data: bytes


@dataclass(frozen=True)
class Answer:
    status: int
    headers: http.client.HTTPMessage
    document: Any


@dataclass
class Server:
    port: int
    checked: int = 0  # answers validated against the document

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        token: str | None = TOKEN,
        host: str | None = None,
        content_type: str = "application/json",
    ) -> Answer:
        """One request (``body`` as JSON, by the standard library, which writes any depth;
        or ``raw`` bytes), its answer validated against the OpenAPI document."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=90)
        headers = {"Host": host or f"127.0.0.1:{self.port}"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        if data is not None:
            headers["Content-Type"] = content_type
        try:
            conn.request(method, path, body=data, headers=headers)
            reply = conn.getresponse()
            payload = reply.read()
        finally:
            conn.close()
        bare, _, query = path.partition("?")
        request = _Request(
            method.lower(),
            bare,
            parameters=RequestParameters(query=ImmutableMultiDict(_pairs(query))),
        )
        response = _Response(
            reply.status,
            reply.headers.get("content-type", ""),
            Headers(list(reply.headers.items())),
            payload,
        )
        OPENAPI.validate_response(request, response)  # raises if undocumented or misshapen
        self.checked += 1
        return Answer(reply.status, reply.headers, orjson.loads(payload))


def _pairs(query: str) -> list[tuple[str, str]]:
    return parse_qsl(query, keep_blank_values=True)


@pytest.fixture
def registered(settings: Settings, pg: psycopg.Connection[Any]) -> Settings:
    for raw in WORKFLOWS:
        register_workflow(pg, parse_workflow(raw))
    return settings


@pytest.fixture
def serve(registered: Settings) -> Iterator[Callable[..., Server]]:
    """`ductor ui`'s server in a thread of this process (the token unless told otherwise)."""
    started: list[tuple[UiServer, threading.Thread]] = []

    def start(**changes: Any) -> Server:
        ui = UiServer(replace(registered, **{"ui_token": TOKEN, **changes}), "127.0.0.1", 0)
        thread = threading.Thread(target=ui.run, name="ui", daemon=True)
        thread.start()
        started.append((ui, thread))
        server = Server(ui.port)
        wait_for(lambda: _answers(server), 30, "the API to answer")
        return server

    yield start
    for ui, thread in started:
        ui.stop()
        thread.join(30)


def _answers(server: Server) -> bool:
    try:
        return server.call("GET", "/api/openapi.json").status == 200
    except OSError:
        return False


@pytest.fixture
def running(
    registered: Settings, processor_thread: Callable[..., ProcessorThread]
) -> Iterator[None]:
    """A processor and a worker whose flaky step fails its first attempt only."""
    processor_thread(registered)
    worker = WorkerThread(registered, sample_registry(flaky_failures=1))
    yield
    worker.stop()


def _rows(pg: psycopg.Connection[Any]) -> tuple[int, int]:
    runs = pg.execute("SELECT count(*) FROM eec_workflow_run").fetchone()
    signals = pg.execute("SELECT count(*) FROM eec_run_signal").fetchone()
    assert runs is not None and signals is not None
    return runs[0], signals[0]


def _start(
    server: Server, workflow: str, run_id: str, run_input: Any = None, **more: Any
) -> Answer:
    body = {"workflow": workflow, "run_id": run_id, **more}
    if run_input is not None:
        body["input"] = run_input
    return server.call("POST", "/api/runs", body)


def test_a_start_and_its_result_waited_for_give_the_output(
    serve: Callable[..., Server], running: None, registered: Settings, pg: psycopg.Connection[Any]
) -> None:
    server = serve()
    order = {"order": "o-1", "lines": [1, 2, 3]}
    started = _start(server, "echoes", "api-echo-1", order, tags={"customer": "c-7"})
    assert (started.status, started.document) == (
        201,
        {"run_id": "api-echo-1", "created": True, "announced": True},
    )
    done = server.call("GET", "/api/runs/api-echo-1/result?wait=60")
    assert done.status == 200, done.document
    assert done.document["status"] == "succeeded" and done.document["finished"] is True
    assert done.document["output"]["input"] == order
    assert done.document == client.result_document(client.get_run(registered, "api-echo-1"))

    # The same start again changes nothing; another input, or another workflow, is refused.
    again = _start(server, "echoes", "api-echo-1", order)
    assert (again.status, again.document["created"]) == (200, False)
    other = _start(server, "echoes", "api-echo-1", {"order": "o-2"})
    assert (other.status, other.document["error"]) == (409, "run_exists")
    assert "exists already with another input" in other.document["reason"]
    assert _start(server, "gate", "api-echo-1").status == 409
    unknown = _start(server, "no-such-workflow", "api-unknown-1")
    assert (unknown.status, unknown.document["error"]) == (404, "unknown_workflow")
    missing = server.call("GET", "/api/runs/api-never-started/result")
    assert (missing.status, missing.document["error"]) == (404, "run_not_found")
    assert _rows(pg)[0] == 1


def test_a_signal_ends_a_waiting_run_and_a_cancel_another(
    serve: Callable[..., Server], running: None
) -> None:
    server = serve()
    for run_id in ("api-gate-a", "api-gate-b", "api-gate-c"):
        assert _start(server, "gate", run_id).status == 201
    waiting = server.call("GET", "/api/runs/api-gate-a/result")
    assert (waiting.status, waiting.document["finished"]) == (200, False)

    body = {"name": "go", "payload": {"by": "ada"}, "signal_id": "go-a-1"}
    sent = server.call("POST", "/api/runs/api-gate-a/signals", body)
    assert (sent.status, sent.document) == (201, {"signal_id": "go-a-1", "new": True})
    done = server.call("GET", "/api/runs/api-gate-a/result?wait=60")
    assert (done.document["status"], done.document["output"]) == ("succeeded", {"by": "ada"})
    again = server.call("POST", "/api/runs/api-gate-a/signals", body)
    assert (again.status, again.document["new"]) == (200, False)
    late = server.call("POST", "/api/runs/api-gate-a/signals", {"name": "go"})
    assert (late.status, late.document["error"]) == (409, "run_ended")
    typo = server.call("POST", "/api/runs/api-gate-c/signals", {"name": "og"})
    assert (typo.status, typo.document["error"]) == (400, "unknown_signal")

    cancelled = server.call("POST", "/api/runs/api-gate-b/cancel")
    assert cancelled.status == 201 and cancelled.document["new"] is True
    ended = server.call("GET", "/api/runs/api-gate-b/result?wait=60")
    assert (ended.document["status"], ended.document["finished"]) == ("cancelled", True)
    twice = server.call("POST", "/api/runs/api-gate-b/cancel")
    assert (twice.status, twice.document["error"]) == (409, "run_ended")

    nobody = server.call("POST", "/api/runs/api-nobody/signals", {"name": "go"})
    assert (nobody.status, nobody.document["error"]) == (404, "run_not_found")
    assert server.call("POST", "/api/runs/api-nobody/cancel").status == 404
    badly = server.call("POST", "/api/runs/api-gate-b/signals", {"name": "no way"})
    assert (badly.status, badly.document["error"]) == (400, "invalid_body")


def test_a_failed_run_is_retried(serve: Callable[..., Server], running: None) -> None:
    server = serve()
    assert _start(server, "once", "api-once-1").status == 201
    failed = server.call("GET", "/api/runs/api-once-1/result?wait=60")
    assert failed.document["status"] == "failed", failed.document
    assert failed.document["failure_reason"]

    # A failed run may be moved to other versions of its steps' functions (none to move here).
    moved = server.call("POST", "/api/runs/api-once-1/upgrade", {"latest": True})
    assert (moved.status, moved.document) == (200, {"run_id": "api-once-1", "moves": []})
    both = server.call("POST", "/api/runs/api-once-1/upgrade", {"latest": True, "to_version": 2})
    assert (both.status, both.document["error"]) == (400, "invalid_body")
    retried = server.call("POST", "/api/runs/api-once-1/retry")
    assert (retried.status, retried.document["steps"]) == (200, ["f"])
    done = server.call("GET", "/api/runs/api-once-1/result?wait=60")
    assert done.document["status"] == "succeeded", done.document
    assert done.document["output"] == {"succeeded_on_attempt": 2}

    refused = server.call("POST", "/api/runs/api-once-1/retry")
    assert (refused.status, refused.document["error"]) == (409, "retry_refused")
    assert "not failed" in refused.document["reason"]
    assert server.call("POST", "/api/runs/api-nobody/retry").status == 404
    ended = server.call("POST", "/api/runs/api-once-1/upgrade", {"latest": True})
    assert (ended.status, ended.document["error"]) == (409, "upgrade_refused")
    assert server.call("POST", "/api/runs/api-nobody/upgrade", {"latest": True}).status == 404


def test_runs_are_found_by_their_filters_page_by_page(serve: Callable[..., Server]) -> None:
    server = serve()
    for i in range(3):
        assert _start(server, "gate", f"api-find-{i}", tags={"batch": "b1"}).status == 201
    assert _start(server, "echoes", "api-find-other", tags={"batch": "b2"}).status == 201

    seen: list[str] = []
    path = "/api/runs?tag=batch%3Db1&limit=2"
    while True:
        page = server.call("GET", path)
        assert page.status == 200, page.document
        seen += [run["run_id"] for run in page.document["runs"]]
        cursor = page.document["next_cursor"]
        if cursor is None:
            break
        path = f"/api/runs?tag=batch%3Db1&limit=2&cursor={quote(cursor)}"
    assert sorted(seen) == ["api-find-0", "api-find-1", "api-find-2"]
    echoes = server.call("GET", "/api/runs?workflow=echoes&status=pending&status=running")
    assert [run["run_id"] for run in echoes.document["runs"]] in (["api-find-other"], [])
    by_id = server.call("GET", "/api/runs?id_prefix=api-find-&since=1h")
    assert len(by_id.document["runs"]) == 4
    assert by_id.document["runs"][0]["tags"] in ({"batch": "b1"}, {"batch": "b2"})
    for wrong in ("status=lost", "limit=0", "limit=x", "cursor=nope", "since=yesterday"):
        answer = server.call("GET", f"/api/runs?{wrong}")
        assert (answer.status, answer.document["error"]) == (400, "invalid_query"), wrong


def _nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"a": value}
    return value


def test_hostile_bodies_are_refused_with_400_and_nothing_is_written(
    serve: Callable[..., Server], pg: psycopg.Connection[Any]
) -> None:
    server = serve()
    refusals: list[tuple[Answer, str, str]] = [
        (_start(server, "gate", "deep-1", _nested(300)), "out_of_bounds", "nested deeper than 64"),
        (_start(server, "gate", "nightly@2026-12-24T18:00:00Z"), "reserved_run_id", "nightly@"),
        (_start(server, "gate", "parent/step#1"), "reserved_run_id", "child run"),
        (_start(server, "gate", "nul-1", {"note": "a\x00b"}), "out_of_bounds", "NUL"),
        (_start(server, "gate", "nul\x00id"), "out_of_bounds", "NUL"),
        (_start(server, "gate", "x" * 201), "invalid_body", "run_id"),
        (
            _start(server, "gate", "huge-1", {"blob": "x" * (1536 * 1024)}),
            "out_of_bounds",
            "more than the 1,048,576 allowed",
        ),
        (
            server.call(
                "POST",
                "/api/runs",
                raw=b'{"workflow": "gate", "run_id": "big-1",'
                b' "input": {"n": 123456789012345678901234567890}}',
            ),
            "out_of_bounds",
            "integer",
        ),
        (server.call("POST", "/api/runs", raw=b'{"workflow": "gate",'), "not_json", "not JSON"),
        (server.call("POST", "/api/runs", raw=b"[" * 300 + b"]" * 300), "invalid_body", "object"),
        (
            _start(server, "gate", "extra-1", surprise=True),
            "invalid_body",
            "'surprise' was unexpected",
        ),
        (_start(server, "gate", "tier-1", tier="t9"), "invalid_body", "tier"),
        (
            _start(server, "gate", "at-1", start_at="tomorrow"),
            "invalid_body",
            "start_at",
        ),
        (_start(server, "gate", "to-1", timeout_ms=0), "invalid_body", "timeout_ms"),
        (_start(server, "gate", "to-2", timeout_ms="5s"), "invalid_body", "timeout_ms"),
    ]
    for answer, error, said in refusals:
        assert answer.status == 400, answer.document
        assert answer.document["error"] == error, answer.document
        assert said in answer.document["reason"], answer.document
    assert "$.a.a.a.a.a.a.a.a" in refusals[0][0].document["reason"]  # the path to it

    # A body past what the server reads at all, or not JSON.
    too_large = server.call("POST", "/api/runs", raw=b" " * (5 * 1024 * 1024))
    assert (too_large.status, too_large.document["error"]) == (413, "too_large")
    form = server.call("POST", "/api/runs", raw=b"workflow=gate", content_type="text/plain")
    assert (form.status, form.document["error"]) == (415, "not_json")

    # A signal to a run that exists: a hostile payload is refused the same way.
    assert _start(server, "gate", "target-1").status == 201
    for payload, said in ((_nested(300), "nested deeper"), ({"k": "\x00"}, "NUL")):
        answer = server.call(
            "POST", "/api/runs/target-1/signals", {"name": "go", "payload": payload}
        )
        assert (answer.status, answer.document["error"]) == (400, "out_of_bounds")
        assert said in answer.document["reason"]
    assert _rows(pg) == (1, 0)


def test_a_start_gives_its_run_its_own_deadline(
    serve: Callable[..., Server], pg: psycopg.Connection[Any]
) -> None:
    server = serve()
    assert _start(server, "gate", "api-deadline-1", timeout_ms=600_000).status == 201
    row = pg.execute(
        "SELECT timeout_ms, extract(epoch FROM deadline_at - created_at)"
        "  FROM eec_workflow_run WHERE run_id = 'api-deadline-1'"
    ).fetchone()
    assert row is not None and row[0] == 600_000 and float(row[1]) == pytest.approx(600, abs=1)


def test_without_the_token_nothing_is_written(
    serve: Callable[..., Server], pg: psycopg.Connection[Any]
) -> None:
    server = serve()
    assert _start(server, "gate", "mine-1").status == 201
    writes: list[tuple[str, Any]] = [
        ("/api/runs", {"workflow": "gate", "run_id": "theirs-1"}),
        ("/api/runs/mine-1/signals", {"name": "go"}),
        ("/api/runs/mine-1/cancel", None),
        ("/api/runs/mine-1/retry", None),
        ("/api/runs/mine-1/upgrade", {"latest": True}),
    ]
    for path, body in writes:
        bare = server.call("POST", path, body, token=None)
        assert (bare.status, bare.document["error"]) == (401, "no_token"), path
        assert bare.headers["WWW-Authenticate"].startswith("Bearer")
    wrong = server.call("POST", "/api/runs", writes[0][1], token="not-the-token")
    assert (wrong.status, wrong.document["error"]) == (401, "wrong_token")
    # Reading is open unless the setting says otherwise.
    assert server.call("GET", "/api/runs/mine-1/result", token=None).status == 200

    # Wrong tokens count against the login form's limit (5 per address a minute): then even
    # the right one is refused for a while.
    for _ in range(4):
        assert server.call("POST", "/api/runs/mine-1/cancel", token="guess").status == 401
    limited = server.call("POST", "/api/runs/mine-1/cancel")
    assert (limited.status, limited.document["error"]) == (429, "too_many_tries")
    assert int(limited.headers["Retry-After"]) >= 1

    # No token configured: the API is read-only; the setting can close reading too.
    read_only = serve(ui_token="")
    refused = read_only.call("POST", "/api/runs", writes[0][1])
    assert (refused.status, refused.document["error"]) == (403, "read_only")
    closed = serve(ui_read_token_required=True)
    assert closed.call("GET", "/api/runs/mine-1/result", token=None).status == 401
    assert closed.call("GET", "/api/runs", token=None).status == 401
    assert closed.call("GET", "/api/runs/mine-1/result").status == 200
    assert closed.call("GET", "/api/openapi.json", token=None).status == 200
    assert _rows(pg) == (1, 0)


def test_a_forged_host_is_refused_and_the_scope_of_producers_holds(
    serve: Callable[..., Server], pg: psycopg.Connection[Any]
) -> None:
    server = serve(requests_workflows=("gate",), requests_run_id_prefixes=("team-a-",))
    # A page of evil.example whose name resolves to this server (DNS rebinding).
    for host in ("evil.example", f"evil.example:{server.port}"):
        forged = server.call(
            "POST", "/api/runs", {"workflow": "gate", "run_id": "team-a-1"}, host=host
        )
        assert (forged.status, forged.document["error"]) == (400, "foreign_host")
        assert "evil.example" not in forged.document["reason"]
    assert server.call("GET", "/api/runs", host="evil.example").status == 400

    # The requests topic's scope is the API's too.
    other = _start(server, "echoes", "team-a-2")
    assert (other.status, other.document["error"]) == (403, "not_allowed")
    assert "may not start workflow 'echoes'" in other.document["reason"]
    outside = _start(server, "gate", "team-b-1")
    assert (outside.status, outside.document["error"]) == (403, "not_allowed")
    assert _rows(pg) == (0, 0)
    assert _start(server, "gate", "team-a-1").status == 201
    signal = server.call("POST", "/api/runs/team-b-1/signals", {"name": "go"})
    assert signal.status == 403
    assert _rows(pg) == (1, 0)


def test_the_document_is_valid_openapi_and_the_usage_curl_block_runs(
    serve: Callable[..., Server], running: None, tmp_path: Any
) -> None:
    server = serve()
    served = server.call("GET", "/api/openapi.json")
    validate(served.document)
    assert served.document == orjson.loads(orjson.dumps(openapi_document()))

    usage = (REPO / "docs" / "usage.md").read_text()
    section = usage.split("## The HTTP API", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.DOTALL)
    assert blocks, "docs/usage.md#the-http-api has a sh block"
    env = {
        **os.environ,
        "API": f"http://127.0.0.1:{server.port}",
        "DUCTOR_UI_TOKEN": TOKEN,
    }
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", blocks[0]],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert '"status":"succeeded"' in done.stdout, done.stdout
    assert server.checked >= 2


def test_waits_are_bounded_and_a_wait_ends_with_its_run(
    serve: Callable[..., Server], running: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(api, "MAX_WAITS", 1)  # one wait at a time: the next is told to ask again
    server = serve()
    assert _start(server, "gate", "api-held").status == 201
    held: list[Answer] = []
    waiters: list[threading.Thread] = []

    def wait_in_a_thread() -> None:
        held.clear()
        waiters.append(
            threading.Thread(
                target=lambda: held.append(server.call("GET", "/api/runs/api-held/result?wait=60"))
            )
        )
        waiters[-1].start()

    def refused() -> bool:
        if held and held[0].status == 429:
            # The waiter came while a probe below held the one slot (a slow machine): it was
            # refused, rightly; it waits again.
            wait_in_a_thread()
            return False
        answer = server.call("GET", "/api/runs/api-held/result?wait=0.1")
        return answer.status == 429 and answer.document["error"] == "too_many_waits"

    wait_in_a_thread()
    wait_for(refused, 30, "a second wait to be refused while the first holds the slot")
    waiter = waiters[-1]
    look = server.call("GET", "/api/runs/api-held/result")  # a look without wait is never held
    assert (look.status, look.document["finished"]) == (200, False)
    assert server.call("POST", "/api/runs/api-held/signals", {"name": "go"}).status == 201
    waiter.join(60)
    assert [(a.status, a.document["status"]) for a in held] == [(200, "succeeded")]
    for wrong in ("-1", "61", "soon"):
        answer = server.call("GET", f"/api/runs/api-held/result?wait={wrong}")
        assert (answer.status, answer.document["error"]) == (400, "invalid_query"), wrong
