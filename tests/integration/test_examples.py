"""The orders example (examples/orders) run end to end as its README tells a user to, through
the installed `ductor` command on the real broker and database: register the workflow, run
`ductor process` and `ductor worker --app steps:registry` from the example's directory, start
runs with an input, read their output with `ductor result --wait`; a run that orders an item
out of stock fails, and `ductor runs retry` finishes it once the item is restocked."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings

from .children import Spawned, child_env, run_ductor
from .runs import step_attempts
from .samples import REPO
from .waiting import wait_for

pytestmark = pytest.mark.integration

EXAMPLE = REPO / "examples" / "orders"

ADA = {
    "order_id": "1001",
    "customer": "ada@example.com",
    "country": "DE",
    "items": [
        {"sku": "book", "qty": 2, "unit_cents": 1250},
        {"sku": "mug", "qty": 1, "unit_cents": 899},
    ],
}
# 2 x 12.50 + 8.99 = 33.99, under 50.00: shipping 4.95; 19 % VAT on 38.94 is 7.3986 -> 7.40.
ADA_OUTPUT = {
    "charges": {
        "subtotal_cents": 3399,
        "shipping_cents": 495,
        "tax_cents": 740,
        "total_cents": 4634,
    },
    "confirmation": {
        "order_id": "1001",
        "customer": "ada@example.com",
        "reservation": "res-order-1001",
        "message": "order 1001: 3 item(s), 46.34 EUR, confirmed",
    },
}
GRACE = {
    "order_id": "1002",
    "customer": "grace@example.com",
    "country": "NL",
    "items": [
        {"sku": "umbrella", "qty": 1, "unit_cents": 2400},
        {"sku": "book", "qty": 3, "unit_cents": 1250},
    ],
}
# 24.00 + 3 x 12.50 = 61.50, free shipping from 50.00; 21 % VAT is 12.915 -> 12.92.
GRACE_OUTPUT = {
    "charges": {
        "subtotal_cents": 6150,
        "shipping_cents": 0,
        "tax_cents": 1292,
        "total_cents": 7442,
    },
    "confirmation": {
        "order_id": "1002",
        "customer": "grace@example.com",
        "reservation": "res-order-1002",
        "message": "order 1002: 4 item(s), 74.42 EUR, confirmed",
    },
}


@pytest.fixture
def orders_dir(tmp_path: Path) -> Path:
    """A copy of examples/orders, so that the test can write out_of_stock.txt beside the
    steps module as a user would, without touching the repository's copy."""
    target = tmp_path / "orders"
    ignored = shutil.ignore_patterns("__pycache__", "out_of_stock.txt")
    shutil.copytree(EXAMPLE, target, ignore=ignored)
    return target


# The example as JSON with its steps module, or written in Python (flow.py): what `ductor
# workflows register` and `ductor worker --app` are given.
AS_JSON = ("workflow.json", "steps:registry")
AS_CODE = ("flow:orders", "flow:orders")


@pytest.fixture
def written_as() -> tuple[str, str]:
    """As JSON, unless a test parametrizes it (pytest gives ``orders`` that value too)."""
    return AS_JSON


@pytest.fixture
def orders(
    settings: Settings,
    pg: psycopg.Connection[Any],
    orders_dir: Path,
    written_as: tuple[str, str],
) -> Iterator[Path]:
    """The example registered on a database that has never seen it, with `ductor process`
    and `ductor worker --app ...` running in its directory; yields the directory."""
    source, app = written_as
    # Registered versions are immutable: start from none, as a new user's database does.
    pg.execute("DELETE FROM eec_workflow_definition WHERE name = 'orders'")
    registered = run_ductor(settings, "workflows", "register", source, cwd=orders_dir)
    assert (registered.returncode, registered.stdout) == (0, "workflow orders v1 registered\n")
    # The installed script in the example's directory, as its README runs them.
    services = [
        Spawned(args, child_env(settings), orders_dir / f"{args[0]}.log", cwd=orders_dir)
        for args in (["process"], ["worker", "--app", app])
    ]
    try:
        yield orders_dir
        for service in services:
            log = service.log_path
            assert service.proc.poll() is None, f"{log.name} exited: {log.read_text()[-2000:]}"
    finally:
        for service in services:
            service.terminate()


def _start(settings: Settings, cwd: Path, run_id: str, run_input: dict[str, Any]) -> None:
    started = run_ductor(
        settings,
        "start",
        "orders",
        "--run-id",
        run_id,
        "--input",
        orjson.dumps(run_input).decode(),
        cwd=cwd,
    )
    assert (started.returncode, started.stdout) == (0, f"{run_id}\n"), started.stderr


@pytest.mark.parametrize("written_as", [AS_JSON, AS_CODE], ids=["json", "code"])
def test_an_order_runs_through_the_example_and_gives_its_declared_output(
    settings: Settings, written_as: tuple[str, str], orders: Path
) -> None:
    """The same whether the workflow is registered from its JSON and run by steps.py's
    registry, or registered and run from its Python form (flow.py)."""
    _start(settings, orders, "order-1001", ADA)
    shown = run_ductor(settings, "result", "order-1001", "--wait", "60", cwd=orders)
    assert shown.returncode == 0, shown.stderr
    assert orjson.loads(shown.stdout) == ADA_OUTPUT
    assert shown.stdout.count("\n") == 1  # one line of JSON

    inspected = run_ductor(settings, "inspect", "order-1001", cwd=orders)
    assert inspected.returncode == 0, inspected.stdout
    lines = inspected.stdout.splitlines()
    assert "status     succeeded" in lines
    output_lines = [line for line in lines if line.startswith("output ")]
    assert len(output_lines) == 1, inspected.stdout
    assert orjson.loads(output_lines[0].removeprefix("output")) == ADA_OUTPUT
    section = lines[lines.index("nodes:") + 1 : lines.index("attempts:")]
    # Each node's line, then (succeeded) its output's line under it.
    nodes = [line.split()[:2] for line in section if line.split()[0] != "output"]
    node_outputs = [line.split(maxsplit=1)[1] for line in section if line.split()[0] == "output"]
    assert len(node_outputs) == 4 and orjson.loads(node_outputs[-1]) == ADA_OUTPUT["confirmation"]
    assert nodes == [
        ["validate", "succeeded"],
        ["price", "succeeded"],
        ["reserve", "succeeded"],
        ["confirm", "succeeded"],
    ]


def test_an_order_out_of_stock_fails_and_a_retry_finishes_it_once_restocked(
    settings: Settings, pg: psycopg.Connection[Any], orders: Path
) -> None:
    """Grace orders an umbrella while it is out of stock: `reserve` fails its 3 attempts and
    the run fails, while Ada's order (no umbrella) succeeds meanwhile and an order to a
    country the shop does not ship to fails at once in `validate`. Once restocked, `ductor
    runs retry` runs `reserve` and `confirm` only, and the run gives its output."""
    (orders / "out_of_stock.txt").write_text("umbrella\n")
    _start(settings, orders, "order-1002", GRACE)
    _start(settings, orders, "order-1001", ADA)
    _start(settings, orders, "order-1003", {**ADA, "order_id": "1003", "country": "US"})

    failed = run_ductor(settings, "result", "order-1002", "--wait", "60", cwd=orders)
    assert (failed.returncode, failed.stdout) == (1, ""), failed.stderr
    assert failed.stderr == (
        "run order-1002 failed: step 'reserve' failed after 3 attempt(s):"
        " StepFailed: out of stock: umbrella\n"
    )
    refused = run_ductor(settings, "result", "order-1003", "--wait", "60", cwd=orders)
    assert refused.returncode == 1
    assert "step 'validate' failed after 1 attempt(s): StepFailed: we do not ship to 'US'" in (
        refused.stderr
    )
    ada = run_ductor(settings, "result", "order-1001", "--wait", "60", cwd=orders)
    assert ada.returncode == 0, ada.stderr
    assert orjson.loads(ada.stdout) == ADA_OUTPUT

    listed = run_ductor(
        settings, "runs", "list", "--workflow", "orders", "--status", "failed", cwd=orders
    )
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == [
        "order-1003",
        "order-1002",
    ]

    (orders / "out_of_stock.txt").unlink()  # restocked
    retried = run_ductor(settings, "runs", "retry", "order-1002", cwd=orders)
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout == "run order-1002 resumed; running again: reserve, confirm\n"
    shown = run_ductor(settings, "result", "order-1002", "--wait", "60", cwd=orders)
    assert shown.returncode == 0, shown.stderr
    assert orjson.loads(shown.stdout) == GRACE_OUTPUT
    assert step_attempts(pg, "order-1002") == {
        "validate": [(1, "succeeded")],
        "price": [(1, "succeeded")],
        "reserve": [(1, "failed"), (2, "failed"), (3, "failed"), (4, "succeeded")],
        "confirm": [(1, "succeeded")],
    }


def test_the_workflow_in_python_registers_as_the_same_definition_and_is_listed_and_shown(
    settings: Settings, pg: psycopg.Connection[Any], orders_dir: Path
) -> None:
    """Registered from workflow.json, the Python form is the same definition (`already
    registered`; a different one would be refused); `workflows list` shows its version and
    steps, `workflows show` the definition as stored."""
    pg.execute("DELETE FROM eec_workflow_definition WHERE name = 'orders'")
    as_json = run_ductor(settings, "workflows", "register", "workflow.json", cwd=orders_dir)
    assert as_json.stdout == "workflow orders v1 registered\n", as_json.stderr
    as_code = run_ductor(settings, "workflows", "register", "flow:orders", cwd=orders_dir)
    assert (as_code.returncode, as_code.stdout) == (0, "workflow orders v1 already registered\n")

    # A definition written by hand that cannot be run is listed too, with no steps.
    pg.execute(
        "INSERT INTO eec_workflow_definition (name, version, definition)"
        """ VALUES ('hand-written', 1, '{"steps": "oops"}') ON CONFLICT DO NOTHING"""
    )
    listed = run_ductor(settings, "workflows", "list", "-o", "json", cwd=orders_dir)
    assert listed.returncode == 0, listed.stderr
    lines = [orjson.loads(line) for line in listed.stdout.splitlines()]
    found = {(w["name"], w["version"]): w["steps"] for w in lines}
    assert found[("orders", 1)] == ["validate", "price", "reserve", "confirm"]
    assert found[("hand-written", 1)] == []
    table = run_ductor(settings, "workflows", "list", cwd=orders_dir).stdout.splitlines()
    assert table[0].split() == ["NAME", "VERSION", "REGISTERED", "STEPS"]
    assert any(line.split()[:2] == ["orders", "1"] for line in table[1:])

    shown = run_ductor(settings, "workflows", "show", "orders", cwd=orders_dir)
    assert shown.returncode == 0, shown.stderr
    written = orjson.loads((orders_dir / "workflow.json").read_bytes())
    assert parse_workflow(orjson.loads(shown.stdout)) == parse_workflow(written)
    missing = run_ductor(settings, "workflows", "show", "orders", "--version", "9", cwd=orders_dir)
    assert (missing.returncode, missing.stderr) == (
        2,  # an unknown workflow is bad input, for every command (docs/usage.md#exit-codes)
        "ductor: workflow 'orders' version 9 is not registered\n",
    )


def test_an_order_waits_for_its_approval_and_the_approver_is_in_its_output(
    settings: Settings, pg: psycopg.Connection[Any], orders: Path
) -> None:
    """approval.json: the order waits at `approve` until `ductor signal ORDER approved
    --payload ...` comes; then it is confirmed, and its output holds the approval."""
    registered = run_ductor(settings, "workflows", "register", "approval.json", cwd=orders)
    assert registered.returncode == 0, registered.stderr
    started = run_ductor(
        settings,
        "start",
        "orders-with-approval",
        "--run-id",
        "order-2001",
        "--input",
        orjson.dumps({**ADA, "order_id": "2001"}).decode(),
        cwd=orders,
    )
    assert started.stdout == "order-2001\n", started.stderr
    waiting = run_ductor(settings, "result", "order-2001", "--wait", "3", cwd=orders)
    assert waiting.returncode == 3  # not finished: it waits for its approval
    signalled = run_ductor(
        settings,
        "signal",
        "order-2001",
        "approved",
        "--payload",
        '{"by": "grace@example.com"}',
        cwd=orders,
    )
    assert signalled.returncode == 0, signalled.stderr
    shown = run_ductor(settings, "result", "order-2001", "--wait", "60", cwd=orders)
    assert shown.returncode == 0, shown.stderr
    output = orjson.loads(shown.stdout)
    assert output["approval"] == {"by": "grace@example.com"}
    assert output["confirmation"]["approved_by"] == "grace@example.com"
    assert output["charges"] == ADA_OUTPUT["charges"]
    nodes = run_ductor(settings, "inspect", "order-2001", cwd=orders).stdout
    assert "approve              succeeded   attempt 1" in nodes


REPORTS = REPO / "examples" / "reports"
REPORT = {
    "lines": ["north: 1234.50 EUR", "south: 980.00 EUR", "east: 1502.75 EUR", "west: 871.25 EUR"],
    "total": "4588.50 EUR",
}


def test_the_report_example_runs_from_its_schedule_and_by_hand(
    settings: Settings, pg: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """examples/reports as its README runs it: the workflow registered from its Python module,
    a worker on it, a schedule (every two seconds here, so that it fires during the test)
    and a trigger; each run's report lists the regions' summaries in order."""
    reports = tmp_path / "reports"
    shutil.copytree(REPORTS, reports, ignore=shutil.ignore_patterns("__pycache__"))
    pg.execute("DELETE FROM eec_workflow_definition WHERE name = 'report'")
    registered = run_ductor(settings, "workflows", "register", "flows:report", cwd=reports)
    assert registered.stdout == "workflow report v1 registered\n", registered.stderr
    services = [
        Spawned(args, child_env(settings), reports / f"{args[0]}.log", cwd=reports)
        for args in (["process"], ["worker", "--app", "flows:report"])
    ]
    regions = '{"regions": ["north", "south", "east", "west"]}'
    schedule = f"report-{uuid.uuid4().hex[:6]}"
    try:
        created = run_ductor(
            settings,
            "schedules",
            "create",
            schedule,
            "--cron",
            "* * * * *",
            "--seconds",
            "*/2",
            "--workflow",
            "report",
            "--input",
            regions,
            cwd=reports,
        )
        assert created.returncode == 0, created.stderr
        triggered = run_ductor(settings, "schedules", "trigger", schedule, cwd=reports)
        run_id = triggered.stdout.strip()
        assert run_id.startswith(f"{schedule}@manual-"), triggered.stderr
        shown = run_ductor(settings, "result", run_id, "--wait", "60", cwd=reports)
        assert (shown.returncode, orjson.loads(shown.stdout or "null")) == (0, REPORT)

        def fired() -> list[str]:
            rows = pg.execute(
                "SELECT run_id FROM eec_workflow_run WHERE run_id LIKE %s AND status ="
                " 'succeeded' AND run_id NOT LIKE %s",
                (f"{schedule}@%", f"{schedule}@manual-%"),
            ).fetchall()
            return [r[0] for r in rows]

        wait_for(lambda: len(fired()) >= 1, 60, "a run the schedule started to end")
        scheduled = run_ductor(settings, "result", fired()[0], cwd=reports)
        assert orjson.loads(scheduled.stdout) == REPORT
        inspected = run_ductor(settings, "inspect", run_id, cwd=reports).stdout
        assert "summarize[3]         succeeded   attempt 1" in inspected
        run_ductor(settings, "schedules", "delete", schedule, cwd=reports)
        for service in services:
            assert service.proc.poll() is None, service.log_path.read_text()[-2000:]
    finally:
        for service in services:
            service.terminate()
