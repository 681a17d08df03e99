"""`ductor ui`'s defences on a real server, against the real services, asked over HTTP as a
browser (or an attacker's script) would: a request addressed to another name is refused
(DNS rebinding), on loopback and beyond; reading can require the token; the login form takes
a few wrong tokens per address and overall, then answers 429; a look at the runs or the dead
letters reads a window of time, never the whole history; and no secret reaches the
commands' output or the log lines at start, while a secret file others may read is warned
about (`ductor config check`, and the start of `ductor ui`)."""

from __future__ import annotations

import http.client
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import psycopg
import pytest
from confluent_kafka import Producer

from processor import client
from processor.core.dead_letters import REASON
from processor.core.routing import TopicNames
from processor.io.config.settings import Settings
from processor.io.kafka.configs import producer_config
from processor.ui import auth

from .children import Spawned, child_env
from .samples import REPO
from .scrape import free_port
from .waiting import wait_for

pytestmark = pytest.mark.integration

TOKEN = f"ui-security-token-{uuid.uuid4().hex}"
DAY_MS = 86_400_000


@dataclass(frozen=True)
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: str


def _ask(
    port: int,
    path: str,
    *,
    method: str = "GET",
    host: str | None = None,
    cookie: str | None = None,
    form: dict[str, str] | None = None,
    source: str = "127.0.0.1",
) -> Answer:
    """One request, its Host header as given (default: the address asked), no redirect
    followed; ``source``: the client address it comes from (any of 127.0.0.0/8)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    headers = {"Host": host or f"127.0.0.1:{port}"}
    if cookie is not None:
        headers["Cookie"] = f"{auth.COOKIE}={cookie}"
    body = None
    if form is not None:
        body = urlencode(form)
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    try:
        conn.request(method, path, body=body, headers=headers)
        reply = conn.getresponse()
        return Answer(reply.status, reply.headers, reply.read().decode())
    finally:
        conn.close()


def _status(port: int, host: str | None = None) -> int:
    try:
        return _ask(port, "/static/ui.css", host=host).status
    except OSError:
        return 0


def _serve(
    spawn: Callable[..., Spawned],
    settings: Settings,
    name: str,
    env: dict[str, str] | None = None,
    host: str = "127.0.0.1",
    probe_host: str | None = None,
) -> int:
    port = free_port()
    ui = spawn(["ui", "--host", host, "--port", str(port)], settings, name, env=env)
    wait_for(lambda: ui.running() and _status(port, probe_host) == 200, 60, f"{name} to answer")
    return port


def _count(answer: Answer) -> int:
    found = re.search(r'id="count">(\d+) ', answer.body)
    assert found is not None, answer.body
    return int(found.group(1))


def test_a_request_for_another_name_is_refused_on_loopback_and_beyond(
    settings: Settings, spawn: Callable[..., Spawned]
) -> None:
    port = _serve(spawn, settings, "ui-loopback", {"DUCTOR_UI_TOKEN": TOKEN})
    for name in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
        assert _ask(port, "/", host=name).status == 200, name
    # A page of evil.example whose name now resolves to 127.0.0.1 (DNS rebinding).
    refused = _ask(port, "/", host=f"evil.example:{port}")
    assert refused.status == 400
    assert "DUCTOR_UI_ALLOWED_HOSTS lists the names it answers to" in refused.body
    assert "evil.example" not in refused.body
    assert _ask(port, "/schedules", host="evil.example").status == 400
    login = {"token": TOKEN}
    assert _ask(port, "/login", method="POST", host="evil.example", form=login).status == 400

    # On every interface, the page has no name of its own: without the setting it won't start.
    bare = spawn(["ui", "--host", "0.0.0.0", "--port", str(free_port())], settings, "ui-any")
    wait_for(lambda: bare.proc.poll() is not None, 60, "ui without allowed hosts to stop")
    assert bare.proc.returncode == 2
    assert "set DUCTOR_UI_ALLOWED_HOSTS" in bare.log_path.read_text()

    named = {"DUCTOR_UI_ALLOWED_HOSTS": "ductor.test,*.ops.test"}
    wide = _serve(spawn, settings, "ui-named", named, "0.0.0.0", probe_host="ductor.test")
    assert _ask(wide, "/", host=f"ductor.test:{wide}").status == 200
    assert _ask(wide, "/", host="ui.ops.test").status == 200
    assert _ask(wide, "/", host=f"127.0.0.1:{wide}").status == 400  # not a name it was given
    assert _ask(wide, "/", host="evil.example").status == 400


def test_reading_needs_the_token_when_the_setting_says_so(
    settings: Settings, spawn: Callable[..., Spawned]
) -> None:
    env = {"DUCTOR_UI_TOKEN": TOKEN, "DUCTOR_UI_READ_TOKEN_REQUIRED": "true"}
    port = _serve(spawn, settings, "ui-closed", env)
    for path in ("/", "/?status=failed", "/runs/a%2Fb", "/dead-letters", "/schedules"):
        answer = _ask(port, path)
        assert answer.status == 303, path
        assert answer.headers["Location"] == "/login?" + urlencode({"next": path}), path
        assert "id=" not in answer.body  # nothing of the page
    assert _ask(port, "/login").status == 200
    assert _ask(port, "/static/ui.css").status == 200
    assert _ask(port, "/", cookie="v1.1.forged").status == 303

    logged_in = _ask(port, "/login", method="POST", form={"token": TOKEN, "next": "/schedules"})
    assert logged_in.status == 303 and logged_in.headers["Location"] == "/schedules"
    cookie = logged_in.headers["Set-Cookie"].split(";")[0].split("=", 1)[1]
    assert _ask(port, "/schedules", cookie=cookie).status == 200
    assert 'id="count"' in _ask(port, "/", cookie=cookie).body


def test_the_login_takes_a_few_wrong_tokens_per_address_and_overall(
    settings: Settings, spawn: Callable[..., Spawned]
) -> None:
    port = _serve(spawn, settings, "ui-login", {"DUCTOR_UI_TOKEN": TOKEN})

    def login(token: str, source: str) -> Answer:
        return _ask(port, "/login", method="POST", form={"token": token}, source=source)

    for _ in range(5):
        assert login("not-the-token-at-all", "127.0.0.1").status == 403
    held = login("not-the-token-at-all", "127.0.0.1")
    assert held.status == 429
    assert 0 < int(held.headers["Retry-After"]) <= 60
    assert "Too many wrong tokens: try again in" in held.body
    # Held, the right token is refused too: the answer must not tell a guess apart.
    assert login(TOKEN, "127.0.0.1").status == 429
    # Another address is not held by this one's tries...
    assert login(TOKEN, "127.0.0.2").status == 303
    # ...until the tries of all addresses together fill the overall count (30 a minute).
    for i in range(3, 8):
        for _ in range(5):
            assert login("not-the-token-at-all", f"127.0.0.{i}").status == 403
    assert login(TOKEN, "127.0.0.9").status == 429


def test_the_runs_and_the_dead_letters_are_read_in_a_window_of_time(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Callable[..., Spawned]
) -> None:
    t = uuid.uuid4().hex[:6]
    ids = [f"win-{t}-{age}d" for age in (0, 3, 10)]
    client.start_runs(settings, "sample", ids, {"n": 1})
    for run_id, age in zip(ids, (0, 3, 10), strict=True):
        pg.execute(
            "UPDATE eec_workflow_run SET created_at = now() - make_interval(days => %s)"
            " WHERE run_id = %s",
            (age, run_id),
        )
    # Two dead letters, one written three days ago (its record's timestamp), one now.
    now_ms = int(time.time() * 1000)
    dlq = TopicNames(settings.topic_prefix).dlq
    producer = Producer(producer_config(settings, "test-ui-window"))
    for key, at_ms in ((f"old-{t}", now_ms - 3 * DAY_MS), (f"new-{t}", now_ms)):
        headers: list[tuple[str, str | bytes | None]] = [(REASON, b"not_json")]
        producer.produce(dlq, b"?", key.encode(), headers=headers, timestamp=at_ms)
    assert producer.flush(30) == 0

    port = _serve(spawn, settings, "ui-window")  # the default window: a day, at most 7
    prefix = f"id_prefix=win-{t}-"

    def run_ids(answer: Answer) -> list[str]:
        return re.findall(rf'class="run-id" href="[^"]*">(win-{t}-\d+d)<', answer.body)

    # By default the page reads the last day: the older runs are neither counted nor listed.
    recent = _ask(port, f"/?{prefix}")
    assert (_count(recent), run_ids(recent)) == (1, [ids[0]])
    assert "the page reads at most 7 days at a time" in recent.body
    wider = _ask(port, f"/?{prefix}&since=4d")
    assert (_count(wider), run_ids(wider)) == (2, ids[:2])
    earlier = _ask(port, f"/?{prefix}&until=60h")  # from 84 h ago to 60 h ago
    assert (_count(earlier), run_ids(earlier)) == (1, [ids[1]])
    too_wide = _ask(port, f"/?{prefix}&since=30d")
    assert too_wide.status == 400
    assert "at most 7 days at a time (DUCTOR_UI_MAX_WINDOW_S)" in too_wide.body
    assert "`ductor runs list`" in too_wide.body

    def letters(query: str) -> list[str]:
        answer = _ask(port, f"/dead-letters?{query}")
        assert answer.status == 200, answer.body
        return re.findall(rf"<code>((?:old|new)-{t})</code>", answer.body)

    assert letters("") == [f"new-{t}"]
    assert letters("reason=not_json&since=4d") == [f"old-{t}", f"new-{t}"]
    assert letters("reason=not_json&until=60h") == [f"old-{t}"]
    refused = _ask(port, "/dead-letters?since=" + quote("30d"))
    assert refused.status == 400 and "`ductor dlq list`" in refused.body


def _file(tmp_path: Path, name: str, text: str, mode: int) -> Path:
    path = tmp_path / name
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


def test_secret_files_others_may_read_are_warned_about_and_no_secret_is_printed(
    settings: Settings, tmp_path: Path
) -> None:
    token = f"token-from-a-file-{uuid.uuid4().hex}"
    for mode, warned in ((0o644, True), (0o600, False)):
        env = child_env(settings)
        for var, text in (("DUCTOR_PG_DSN", settings.pg_dsn), ("DUCTOR_UI_TOKEN", token)):
            env.pop(var)
            path = _file(tmp_path, f"{var.lower()}-{mode:o}", text, mode)
            env[f"{var}_FILE"] = str(path)
        # (config check's exit code also says whether every topic exists: not asked here)
        outputs = [
            _run(["config", "check"], env),
            _run(["config", "show", "--output", "json"], env),
        ]
        assert outputs[1].returncode == 0, outputs[1].stderr
        check = outputs[0].stdout
        warnings = [line for line in check.splitlines() if line.startswith("WARN")]
        if warned:
            assert len(warnings) == 2, check
            assert any("DUCTOR_PG_DSN_FILE" in w and "(mode 0644)" in w for w in warnings)
        else:
            assert warnings == [], check
        for done in outputs:
            printed = done.stdout + done.stderr
            assert token not in printed and settings.pg_dsn not in printed


def test_the_ui_s_start_logs_a_secret_file_warning_and_no_secret(
    settings: Settings, tmp_path: Path
) -> None:
    token = f"token-from-a-file-{uuid.uuid4().hex}"
    env = child_env(settings)
    env.pop("DUCTOR_UI_TOKEN")
    env["DUCTOR_UI_TOKEN_FILE"] = str(_file(tmp_path, "token", token, 0o644))
    env["DUCTOR_KAFKA_SASL_OAUTHBEARER_CONFIG"] = f"principal=ui secret={token}"
    port = free_port()
    ui = Spawned(["ui", "--port", str(port)], env, tmp_path / "ui.log")
    try:
        wait_for(lambda: ui.running() and _status(port) == 200, 60, "the ui to answer")
    finally:
        ui.terminate()
    lines = ui.log_lines()
    assert any("DUCTOR_UI_TOKEN_FILE" in line["msg"] for line in lines), lines
    assert any(line["msg"] == "ui serving" for line in lines), lines
    assert token not in ui.log_path.read_text()


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "processor", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
