"""The web page's pure parts (processor/ui): the DAG laid out by levels, a step's state read
from `inspect --output json`'s document, the token and its session cookie, what a POST's
Origin may be, the filters' shared reading (client.parse_filter) and the command without its
extra; the names the page answers to, the login's limit (on an injected clock) and the window of
history a look reads. The pages themselves are tested in a browser
(tests/integration/test_ui.py) and on a real server (tests/integration/test_ui_security.py)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.client import parse_filter
from processor.core.run_state import RunStatus
from processor.io.config.settings import Settings, load_settings
from processor.io.config.values import ConfigError
from processor.io.runtime.listen import ListenError
from processor.ui import auth
from processor.ui.dag import BOX_H, BOX_W, GAP_X, StepState, layout, levels, step_states
from processor.ui.hosts import LOOPBACK_HOSTS, host_allowed, host_of, served_hosts
from processor.ui.login_limit import LoginLimiter, LoginLimits
from processor.ui.pages import environment, query, run_url, when
from processor.ui.run_view import run_sections
from processor.ui.window import Window, as_duration, span, window


def _step(name: str, *after: str) -> StepState:
    return StepState(name, "task", "fast", after, "pending", 0)


def test_each_step_stands_one_column_right_of_its_deepest_dependency() -> None:
    steps = [("fetch", ()), ("transform", ("fetch",)), ("enrich", ("fetch",))]
    steps += [("publish", ("transform", "enrich")), ("audit", ("fetch", "publish"))]
    assert levels(steps) == [["fetch"], ["transform", "enrich"], ["publish"], ["audit"]]
    assert levels([("b", ()), ("a", ())]) == [["b", "a"]]  # the definition's order
    assert levels([]) == []
    with pytest.raises(ValueError, match="missing or on each other"):
        levels([("a", ("b",)), ("b", ("a",))])
    with pytest.raises(ValueError, match="steps a depend"):
        levels([("a", ("nowhere",))])


def test_the_layout_centres_short_columns_and_points_every_edge_right() -> None:
    shown = layout([_step("v"), _step("c", "v"), _step("n", "v"), _step("r", "c", "n")])
    boxes = {b.step.name: b for b in shown.boxes}
    assert boxes["c"].x == boxes["n"].x > boxes["v"].x
    assert boxes["v"].y == boxes["r"].y == (boxes["c"].y + boxes["n"].y) // 2
    assert shown.width == 2 * 12 + 3 * BOX_W + 2 * GAP_X
    assert shown.height == 2 * 12 + 2 * BOX_H + 22
    assert [(e.source, e.target) for e in shown.edges] == [
        ("v", "c"),
        ("v", "n"),
        ("c", "r"),
        ("n", "r"),
    ]
    assert shown.edges[0].path.startswith(f"M{boxes['v'].x + BOX_W},")


@given(st.lists(st.sets(st.integers(0, 30), max_size=4), min_size=1, max_size=30))
def test_every_dependency_is_in_an_earlier_column(picks: list[set[int]]) -> None:
    """Any DAG (each step depending on some of those before it) is laid out left to right."""
    steps = [(f"s{i}", tuple(f"s{d}" for d in sorted(p) if d < i)) for i, p in enumerate(picks)]
    column = {name: col for col, names in enumerate(levels(steps)) for name in names}
    assert sorted(column) == sorted(name for name, _ in steps)
    for name, after in steps:
        assert all(column[a] < column[name] for a in after)
        assert column[name] == 0 or any(column[a] == column[name] - 1 for a in after)


def test_a_step_s_state_comes_from_its_node_and_a_map_s_from_its_items() -> None:
    document = {
        "steps": [
            {"name": "list", "kind": "task", "type": "fast", "after": []},
            {"name": "resize", "kind": "map", "type": "img", "after": ["list"]},
            {"name": "child", "kind": "workflow", "type": "", "after": ["resize"]},
        ],
        "nodes": [
            {"node": "list", "status": "succeeded", "attempt": 1, "error": None},
            {"node": "resize", "status": "dispatched", "attempt": 0, "error": None},
            {"node": "resize[0]", "status": "succeeded", "attempt": 1},
            {"node": "resize[1]", "status": "succeeded", "attempt": 2},
            {"node": "resize[2]", "status": "retry_wait", "attempt": 1},
        ],
    }
    first, mapped, child = step_states(document)
    assert (first.status, first.attempt, first.items) == ("succeeded", 1, ())
    assert mapped.items == (("retry_wait", 1), ("succeeded", 2))
    assert (child.status, child.after, child.kind) == ("pending", ("resize",), "workflow")
    assert step_states({"load_error": "bad row", "attempts": []}) == []


def test_the_token_is_compared_whole_and_never_matches_when_none_is_set() -> None:
    token = "t" * 24
    assert auth.token_matches(token, token)
    assert not auth.token_matches(token, token[:-1])
    assert not auth.token_matches(token, token + "x")
    assert not auth.token_matches("", "")


def test_a_session_is_the_token_s_own_until_it_expires() -> None:
    token, now = "k" * 24, 1_800_000_000
    cookie = auth.new_session(token, now)
    assert token not in cookie
    assert auth.session_valid(token, cookie, now)
    assert auth.session_valid(token, cookie, now + auth.SESSION_S - 1)
    assert not auth.session_valid(token, cookie, now + auth.SESSION_S)
    assert not auth.session_valid("o" * 24, cookie, now)  # the token changed: every session ends
    assert not auth.session_valid("", cookie, now)  # no token: read-only, whatever the cookie
    issued, mac = cookie.split(".")[1:]
    later = int(issued) + 3600
    assert not auth.session_valid(token, f"v1.{later}.{mac}", now)  # a forged issue time
    for forged in (None, "", "v1", "v1.x.y", f"v2.{issued}.{mac}", f"v1.{issued}.{mac[:-1]}0"):
        assert not auth.session_valid(token, forged, now)


def test_a_post_from_another_site_is_refused_and_the_next_page_is_ours() -> None:
    assert auth.same_origin(None, "127.0.0.1:8080")
    assert auth.same_origin("http://127.0.0.1:8080", "127.0.0.1:8080")
    assert not auth.same_origin("http://127.0.0.1:8081", "127.0.0.1:8080")
    assert not auth.same_origin("https://evil.example", "127.0.0.1:8080")
    assert not auth.same_origin("null", "127.0.0.1:8080")
    assert auth.safe_next("/runs/a%2Fb") == "/runs/a%2Fb"
    for elsewhere in (None, "", "https://evil.example/", "//evil.example", "/\\evil.example"):
        assert auth.safe_next(elsewhere) == "/"


def test_the_pages_show_ids_and_times_as_written() -> None:
    assert run_url("parent/charge#2") == "/runs/parent%2Fcharge%232"
    assert run_url("nightly@2026-01-01T03:00:00Z") == "/runs/nightly%402026-01-01T03%3A00%3A00Z"
    assert when("2026-05-01T14:00:03.250+02:00") == "2026-05-01 12:00:03"
    assert when(None) == "-"
    pairs = [("status", "failed"), ("status", "running"), ("limit", "2")]
    assert query(pairs, limit="5") == "?status=failed&status=running&limit=5"


def test_the_filters_read_as_the_command_line_reads_them() -> None:
    now = 1_800_000_000_000
    wanted = parse_filter(
        now_ms=now, statuses=["failed", "failed"], since="2h", tags=["b=2", "a=1"]
    )
    assert wanted.statuses == (RunStatus.FAILED,) and wanted.since_ms == now - 7_200_000
    assert wanted.tags == (("a", "1"), ("b", "2"))
    with pytest.raises(ValueError, match=r"^since 'soon': expected an ISO 8601 time"):
        parse_filter(now_ms=now, since="soon")
    with pytest.raises(ValueError, match=r"^--until '2026-01-01T00:00:00': say the time's offset"):
        parse_filter(now_ms=now, until="2026-01-01T00:00:00", names={"until": "--until"})
    with pytest.raises(ValueError, match="a status is one of pending, running"):
        parse_filter(now_ms=now, statuses=["done"])


def test_a_port_in_use_names_the_ui_s_own_flags() -> None:
    error = ListenError("ui", "127.0.0.1", 8080, OSError(98, "Address already in use"))
    assert str(error) == (
        "the ui endpoint cannot listen on 127.0.0.1:8080; something else listens there: stop it"
        " or set --port to a free port"
    )
    missing = ListenError("ui", "10.9.9.9", 8080, OSError(99, "Cannot assign requested address"))
    assert str(missing).endswith("no interface of this machine has that address: check --host")


def test_without_the_ui_extra_the_command_says_how_to_install_it() -> None:
    code = (
        "import sys\n"
        "sys.modules['uvicorn'] = None  # as if the extra were not installed\n"
        "from processor.cli.main import main\n"
        "sys.exit(main(['ui']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "ductor: ductor ui needs the ui extra (uvicorn is not installed):"
        " pip install 'ductor-processor[ui]'\n"
    )


# -- the names the page answers to (DNS rebinding) ----------------------------------------------


def test_a_page_on_loopback_answers_to_this_machine_s_names_only() -> None:
    served = served_hosts("127.0.0.1", (), loopback=True)
    assert served == ("127.0.0.1", "localhost", "::1")
    for header in ("127.0.0.1:8080", "localhost", "LOCALHOST:80", "localhost.", "[::1]:8080"):
        assert host_allowed(header, served), header
    # A site whose name its owner made resolve to 127.0.0.1 still sends its own name.
    for foreign in ("evil.example", "evil.example:8080", "127.0.0.1.evil.example", None, ""):
        assert not host_allowed(foreign, served), foreign
    assert served_hosts("::1", (), loopback=True) == ("::1", "127.0.0.1", "localhost")


def test_off_loopback_the_page_answers_to_its_address_or_the_names_it_is_given() -> None:
    assert served_hosts("10.0.0.5", (), loopback=False) == ("10.0.0.5",)
    assert not host_allowed("localhost:8080", ("10.0.0.5",))
    assert host_allowed("10.0.0.5:8080", ("10.0.0.5",))
    given = ("ductor.example.com", "*.internal", "fd00::5")
    assert served_hosts("0.0.0.0", given, loopback=False) == given
    assert host_allowed("ductor.example.com:443", given)
    assert host_allowed("ui.ops.internal", given)
    assert host_allowed("[fd00:0::5]:8080", given)  # an IPv6 address in any of its spellings
    assert not host_allowed("internal", given)
    assert not host_allowed("ductor.example.com.evil.example", given)
    assert host_allowed("anything.at.all", ("*",))
    # Bound to every interface, the page has no name of its own: the setting must say them.
    for everywhere in ("0.0.0.0", "::"):
        with pytest.raises(ConfigError, match="set DUCTOR_UI_ALLOWED_HOSTS"):
            served_hosts(everywhere, (), loopback=False)


@pytest.mark.parametrize("header", ["[::1", "[::1]x", "[::1]:", "::1", "localhost:http", ":80"])
def test_a_host_header_that_names_no_host_is_refused(header: str) -> None:
    assert host_of(header) is None
    assert not host_allowed(header, LOOPBACK_HOSTS)


def test_the_allowed_hosts_setting_reads_names_addresses_and_domains() -> None:
    settings = load_settings({"DUCTOR_UI_ALLOWED_HOSTS": " Ductor.Example.com, [::1] ,*.ops.io,,"})
    assert settings.ui_allowed_hosts == ("ductor.example.com", "::1", "*.ops.io")
    assert load_settings({}).ui_allowed_hosts == ()
    for bad in ("http://x", "a_b.example", "*.", "x..y"):
        with pytest.raises(ConfigError, match="DUCTOR_UI_ALLOWED_HOSTS"):
            load_settings({"DUCTOR_UI_ALLOWED_HOSTS": bad})


# -- how many wrong tokens the login form takes -------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_wrong_tokens_from_one_address_are_refused_for_the_rest_of_the_window() -> None:
    clock = _Clock()
    limiter = LoginLimiter(LoginLimits(per_client=3, overall=100, window_s=60), clock)
    for _ in range(3):
        assert limiter.retry_after("10.0.0.1") is None
        limiter.failed("10.0.0.1")
        clock.now += 1
    assert limiter.retry_after("10.0.0.1") == pytest.approx(57)  # the first try leaves at 60
    assert limiter.retry_after("10.0.0.2") is None  # another address is not held
    clock.now += 57
    assert limiter.retry_after("10.0.0.1") is None  # one try left the window: one more
    limiter.failed("10.0.0.1")
    assert limiter.retry_after("10.0.0.1") == pytest.approx(1)
    limiter.succeeded("10.0.0.1")  # the right token forgives the address's own tries
    assert limiter.retry_after("10.0.0.1") is None


def test_wrong_tokens_from_many_addresses_hold_every_login_until_they_age_out() -> None:
    clock = _Clock()
    limiter = LoginLimiter(LoginLimits(per_client=3, overall=10, window_s=60), clock)
    for i in range(10):
        assert limiter.retry_after(f"10.0.1.{i}") is None
        limiter.failed(f"10.0.1.{i}")
    assert limiter.retry_after("192.168.0.9") == pytest.approx(60)  # even a new address
    assert limiter.tracked() == 10
    clock.now += 60
    assert limiter.retry_after("192.168.0.9") is None
    assert limiter.tracked() == 0  # the addresses leave with their tries: memory is bounded


# -- the window of history a look reads ---------------------------------------------------------

_DAY_MS = 86_400_000


def _window(since: int | None, until: int | None) -> Window:
    return window(
        since, until, now_ms=100 * _DAY_MS, default_s=86400, max_s=7 * 86400, instead="the CLI"
    )


def test_a_look_reads_the_default_window_up_to_the_maximum() -> None:
    assert _window(None, None) == Window(99 * _DAY_MS, None)
    assert _window(None, 50 * _DAY_MS) == Window(49 * _DAY_MS, 50 * _DAY_MS)
    assert _window(93 * _DAY_MS, None) == Window(93 * _DAY_MS, None)
    with pytest.raises(ValueError, match=r"at most 7 days at a time .* is 8 days: narrow .* CLI"):
        _window(92 * _DAY_MS, None)
    with pytest.raises(ValueError, match="Since must be before Until"):
        _window(50 * _DAY_MS, 50 * _DAY_MS)
    assert span(7 * 86400) == "7 days" and span(3600) == "1 hour" and span(90) == "90 seconds"
    assert as_duration(86400) == "1d" and as_duration(5400) == "90m" and as_duration(61) == "61s"


def test_the_window_settings_fit_together() -> None:
    assert (Settings().ui_window_s, Settings().ui_max_window_s) == (86400.0, 7 * 86400.0)
    with pytest.raises(ConfigError, match="DUCTOR_UI_WINDOW_S=864000 is longer than"):
        load_settings({"DUCTOR_UI_WINDOW_S": "864000"})
    with pytest.raises(ConfigError, match="DUCTOR_UI_MAX_WINDOW_S='inf' must be at most"):
        load_settings({"DUCTOR_UI_MAX_WINDOW_S": "inf"})
    with pytest.raises(ConfigError, match="DUCTOR_UI_READ_TOKEN_REQUIRED is true but no"):
        load_settings({"DUCTOR_UI_READ_TOKEN_REQUIRED": "true"})


def test_the_run_page_shows_each_attempts_last_heartbeat_and_a_slot_kept() -> None:
    """An attempt's last heartbeat (when, and the details the step gave) and the slot its
    execution keeps after the attempt ended, as `ductor inspect --output json` says them."""
    attempt = {
        "node": "load",
        "attempt": 1,
        "dispatched": None,
        "started": "2026-05-01T12:00:00+00:00",
        "ended": None,
        "worker": "w-1",
        "executions": 1,
        "duration_s": None,
        "outcome": None,
        "error": None,
        "heartbeat": {"at": "2026-05-01T12:00:03+00:00", "details": {"rows": 4200}},
        "running": True,
        "execution_ended": None,
        "holds_slots": ["c/warehouse/"],
        "version": 2,
    }
    run = {
        "run_id": "r-1",
        "workflow": "etl",
        "version": 1,
        "status": "running",
        "failure_reason": None,
        "tier": "t1",
        "tags": {},
        "created_at": "2026-05-01T12:00:00+00:00",
        "updated_at": "2026-05-01T12:00:00+00:00",
        "start_at": None,
        "next_wakeup_at": None,
        "quarantine_reason": None,
        "output": None,
        "attempts": [attempt],
    }
    html = (
        environment()
        .get_template("run.html")
        .render(
            run=run,
            dag=None,
            timeline=None,
            refresh_ms=0,
            done=None,
            token_configured=False,
            read_token_required=False,
            logged_in=False,
            here="/runs/r-1",
            can_retry=False,
            can_cancel=True,
            **run_sections(run),
        )
    )
    assert '2026-05-01 12:00:03 <code class="details">{"rows": 4200}</code>' in html
    assert "it keeps its slot of c/warehouse/ until it ends" in html
    assert '<td>w-1 <span class="muted version">v2</span></td>' in html  # its function's version


def test_the_run_page_lists_attempts_by_their_start_then_step_then_attempt() -> None:
    """As the timeline reads: by the claim, else the dispatch (in flight, unclaimed), else the
    end (a wait step); ties by step then attempt; an attempt with no time yet last. Not by
    the steps' names, as the document lists them."""

    def attempt(node: str, n: int, **times: str) -> dict[str, Any]:
        at = {key: f"2026-05-01T12:00:{value}+00:00" for key, value in times.items()}
        return {"node": node, "attempt": n, "started": None, "dispatched": None, "ended": None} | at

    document = {
        "attempts": [
            attempt("approve", 1, ended="07"),  # a wait step: no claim
            attempt("charge", 1, started="02", ended="03"),
            attempt("charge", 2, started="05", ended="06"),
            attempt("charge", 3, dispatched="08"),  # in flight, not claimed yet
            attempt("enrich", 1, started="02", ended="04"),
            attempt("fetch", 1, started="00.5", ended="01"),
            attempt("later", 1),
        ]
    }
    shown = run_sections(document)["attempts"]
    assert [(a["node"], a["attempt"]) for a in shown] == [
        ("fetch", 1),
        ("charge", 1),
        ("enrich", 1),
        ("charge", 2),
        ("approve", 1),
        ("charge", 3),
        ("later", 1),
    ]


def test_the_run_page_says_where_a_run_stands_with_its_workflows_key() -> None:
    """A run of a workflow with ``concurrency``: the key's value, its place in line, the
    key's live runs, as `ductor inspect --output json` says them (``key``)."""
    run = {
        "run_id": "r-2",
        "workflow": "orders",
        "version": 1,
        "status": "pending",
        "failure_reason": None,
        "tier": "t1",
        "tags": {},
        "created_at": "2026-05-01T12:00:00+00:00",
        "updated_at": "2026-05-01T12:00:00+00:00",
        "start_at": None,
        "next_wakeup_at": None,
        "quarantine_reason": None,
        "output": None,
        "key": {
            "limit": "run:orders",
            "key": "customer.id",
            "value": "c-7",
            "holds_slot": False,
            "waiting_since": "2026-05-01T12:00:00+00:00",
            "place": 3,
            "live": 1,
            "of": 1,
        },
        "attempts": [],
    }
    html = (
        environment()
        .get_template("run.html")
        .render(
            run=run,
            dag=None,
            timeline=None,
            refresh_ms=0,
            done=None,
            token_configured=False,
            read_token_required=False,
            logged_in=False,
            here="/runs/r-2",
            can_retry=False,
            can_cancel=True,
            **run_sections(run),
        )
    )
    assert "customer.id=c-7: waits for a slot, place 3 in line (1 of 1 live)" in html
