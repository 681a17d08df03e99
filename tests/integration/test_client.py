"""The Python client and the commands built on it, against the real broker and database:
`ductor worker --app` with a steps module of the user's own, start / get / wait / list /
signal, `ductor result`, `ductor runs list`, and `ductor runs retry` of a failed run."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from processor import client
from processor.core.model import LoadedRun, SignalKind
from processor.core.run_ends import force_fail
from processor.core.run_state import RunStatus
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres.runs_admin import insert_runs
from processor.io.postgres.store import Definitions, force_fail_write, load_runs
from processor.io.postgres.workflows import register_workflow

from .audit import assert_results_applied, assert_transitions_applied_once
from .children import Spawned, child_env, run_ductor
from .instances import WorkerThread
from .runs import step_attempts
from .samples import sample_workflow
from .waiting import wait_for

pytestmark = pytest.mark.integration


STEPS_MODULE = '''
"""Step functions of a test: `gate` fails while a file named gate-closed is beside this
module; `hold` holds its attempt while a file named hold is (until its deadline)."""
import pathlib
import threading
import time

from processor.worker import StepContext, StepFailed, StepRegistry

HERE = pathlib.Path(__file__).parent
registry = StepRegistry()
not_a_registry = {"gate": None}


@registry.step("echo")
def echo(ctx: StepContext) -> dict:
    return {"node": ctx.node, "attempt": ctx.attempt}


@registry.step("gate")
def gate(ctx: StepContext) -> dict:
    if (HERE / "gate-closed").exists():
        raise StepFailed("the gate is closed")
    return {"passed_on_attempt": ctx.attempt}


@registry.step("hold")
def hold(ctx: StepContext) -> dict:
    pause = threading.Event()  # never set: a bounded wait between two looks at the file
    while (HERE / "hold").exists() and time.time() * 1000 < ctx.deadline_ms:
        pause.wait(0.05)
    return {"held": True}
'''


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    """A directory holding the steps module `teststeps.py` (and nothing installed)."""
    (tmp_path / "teststeps.py").write_text(STEPS_MODULE)
    (tmp_path / "broken_steps.py").write_text("import a_module_that_is_not_there\n")
    return tmp_path


@pytest.fixture
def app_worker(settings: Settings, app_dir: Path) -> Iterator[Spawned]:
    """`ductor worker --app teststeps:registry`, started in ``app_dir``."""
    args = ["worker", "--app", "teststeps:registry", "--threads", "4"]
    worker = Spawned(args, child_env(settings), app_dir / "worker.log", cwd=app_dir)
    try:
        yield worker
    finally:
        worker.terminate()


def _register(pg: psycopg.Connection[Any], name: str, steps: list[dict[str, Any]]) -> None:
    register_workflow(pg, parse_workflow({"name": name, "version": 1, "steps": steps}))


@pytest.mark.parametrize(
    ("app", "message"),
    [
        ("teststeps", "is not MODULE:ATTRIBUTE"),
        ("teststeps:", "is not MODULE:ATTRIBUTE"),
        ("not_there:registry", "cannot import module 'not_there': ModuleNotFoundError"),
        (
            "broken_steps:registry",
            "cannot import module 'broken_steps': ModuleNotFoundError: No module named"
            " 'a_module_that_is_not_there'",
        ),
        ("teststeps:no_such_registry", "module 'teststeps' has no attribute 'no_such_registry'"),
        ("teststeps:not_a_registry", "teststeps:not_a_registry is a dict, not a StepRegistry"),
    ],
)
def test_a_worker_refuses_an_app_it_cannot_use_with_exit_2(
    base_settings: Settings, app_dir: Path, app: str, message: str
) -> None:
    started = time.monotonic()
    done = run_ductor(base_settings, "worker", "--app", app, cwd=app_dir)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # one sentence, no traceback
    assert time.monotonic() - started < 30  # refused at once, before any connection


def test_the_client_starts_waits_for_lists_and_signals_runs(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    _register(pg, "failing", [{"name": "only", "type": "fail", "retry": {"max_attempts": 1}}])
    tag = uuid.uuid4().hex[:6]
    ok, bad, stopped = f"ok-{tag}", f"bad-{tag}", f"stopped-{tag}"
    # Cancelled before any processor looks at it: its first tick sees the signal.
    assert client.start_run(settings, "sample", stopped, {"n": 3}).created
    signal = client.send_signal(settings, stopped, SignalKind.CANCEL, signal_id=f"stop-{tag}")
    assert signal.new and signal.signal_id == f"stop-{tag}"
    assert not client.send_signal(settings, stopped, SignalKind.CANCEL, f"stop-{tag}").new
    assert client.start_run(settings, "sample", ok, {"n": 1}, tier="t0").created
    assert client.start_run(settings, "failing", bad).created
    # Starting is idempotent by run id; the same id for another workflow is refused (and so
    # is another input: test_start_conflicts.py).
    assert client.start_run(settings, "sample", ok, {"n": 1}) == client.StartedRun(
        ok, created=False
    )
    with pytest.raises(client.ClientError, match="exists already, of workflow 'sample'"):
        client.start_run(settings, "failing", ok)
    with pytest.raises(client.RunNotFound):
        client.get_run(settings, f"nobody-{tag}")
    assert client.get_run(settings, ok).status is RunStatus.PENDING

    processor_thread(settings)
    worker = WorkerThread(settings)
    try:
        done = client.wait_for_run(settings, ok, timeout_s=60)
        failed = client.wait_for_run(settings, bad, timeout_s=60)
        cancelled = client.wait_for_run(settings, stopped, timeout_s=60)
    finally:
        worker.stop()
    # The output column stays NULL until the commit writes one: "no output".
    assert done == client.RunResult(ok, RunStatus.SUCCEEDED, None, None)
    assert failed.status is RunStatus.FAILED
    assert failed.failure_reason is not None and "step 'only' failed" in failed.failure_reason
    assert cancelled.status is RunStatus.CANCELLED
    assert cancelled.failure_reason == "cancelled by signal"

    assert [r.run_id for r in client.list_runs(settings)] == [bad, ok, stopped]
    sample = client.list_runs(settings, workflow="sample")
    assert [(r.run_id, r.status) for r in sample] == [
        (ok, RunStatus.SUCCEEDED),
        (stopped, RunStatus.CANCELLED),
    ]
    assert sample[0].workflow == ("sample", 1) and sample[0].failure_reason is None
    assert [r.run_id for r in client.list_runs(settings, status=RunStatus.FAILED)] == [bad]
    assert client.list_runs(settings, workflow="failing", status=RunStatus.SUCCEEDED) == []
    assert [r.run_id for r in client.list_runs(settings, limit=1)] == [bad]

    listed = run_ductor(settings, "runs", "list", "--workflow", "sample", "--limit", "5")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == [
        "RUN",
        "WORKFLOW",
        "STATUS",
        "LAST",
        "TRANSITION",
        "TAGS",
        "FAILURE",
        "REASON",
    ]
    assert [line.split()[:4] for line in lines[1:]] == [
        [ok, "sample", "v1", "succeeded"],
        [stopped, "sample", "v1", "cancelled"],
    ]
    assert lines[2].endswith("cancelled by signal")
    failing = run_ductor(settings, "runs", "list", "--status", "failed")
    assert [line.split()[0] for line in failing.stdout.splitlines()[1:]] == [bad]
    assert run_ductor(settings, "runs", "list", "--limit", "0").returncode == 2

    shown = run_ductor(settings, "result", ok)
    assert (shown.returncode, shown.stdout) == (0, "null\n")
    shown = run_ductor(settings, "result", bad)
    assert shown.returncode == 1 and shown.stdout == ""
    assert f"run {bad} failed: step 'only' failed" in shown.stderr
    shown = run_ductor(settings, "result", stopped, "--wait", "5")
    assert shown.returncode == 1 and "cancelled: cancelled by signal" in shown.stderr


def test_waiting_for_a_run_that_cannot_finish_times_out(settings: Settings) -> None:
    """No processor runs: the run stays pending, and every way of waiting says so."""
    run_id = f"stalled-{uuid.uuid4().hex[:6]}"
    client.start_run(settings, "sample", run_id)
    started = time.monotonic()
    with pytest.raises(client.RunNotFinished, match=r"is still pending after 0\.8 s") as caught:
        client.wait_for_run(settings, run_id, timeout_s=0.8)
    assert 0.8 <= time.monotonic() - started < 10
    assert caught.value.result.status is RunStatus.PENDING

    now = run_ductor(settings, "result", run_id)
    assert now.returncode == 3 and now.stdout == ""
    assert f"run {run_id!r} is still pending; not finished" in now.stderr
    waited = run_ductor(settings, "result", run_id, "--wait", "0.5")
    assert waited.returncode == 3 and "still pending after 0.5 s" in waited.stderr
    unknown = run_ductor(settings, "result", f"nobody-{run_id}", "--wait", "1")
    assert unknown.returncode == 1 and "no run with id" in unknown.stderr  # not found: 1
    assert run_ductor(settings, "result", run_id, "--wait", "-1").returncode == 2
    refused = run_ductor(settings, "runs", "retry", run_id)
    assert refused.returncode == 1
    assert f"run {run_id!r} is pending, not failed" in refused.stderr


def test_retry_resumes_a_failed_run_from_its_failed_step(
    settings: Settings,
    audit: psycopg.Connection[Any],
    processor_thread: Any,
    app_dir: Path,
    app_worker: Spawned,
) -> None:
    """`first` succeeds, `gate` fails its two attempts (the gate is closed), so the run fails
    and `last` never starts. Once the gate is open, `ductor runs retry` runs `gate` again as
    attempt 3 and then `last`; `first` is not run again, and every write is a transition
    applied once. A run that is running, or succeeded, is not retried."""
    pg = audit
    _register(
        pg,
        "client-gated",  # (workflow names are shared by every test on the database)
        [
            {"name": "first", "type": "echo"},
            {"name": "gate", "type": "gate", "depends_on": ["first"], "retry": {"max_attempts": 2}},
            {"name": "last", "type": "echo", "depends_on": ["gate"]},
        ],
    )
    _register(pg, "held", [{"name": "only", "type": "hold", "timeout_ms": 60_000}])
    (app_dir / "gate-closed").touch()
    tag = uuid.uuid4().hex[:6]
    run_id, held = f"gated-{tag}", f"held-{tag}"
    processor_thread(settings)
    client.start_run(settings, "client-gated", run_id)
    failed = client.wait_for_run(settings, run_id, timeout_s=60)
    assert failed.status is RunStatus.FAILED
    assert failed.failure_reason == (
        "step 'gate' failed after 2 attempt(s): StepFailed: the gate is closed"
    )
    assert step_attempts(pg, run_id) == {
        "first": [(1, "succeeded")],
        "gate": [(1, "failed"), (2, "failed")],
    }

    # A running run (its step held by the worker, which holds its whole batch meanwhile).
    (app_dir / "hold").touch()
    client.start_run(settings, "held", held)
    wait_for(lambda: client.get_run(settings, held).status is RunStatus.RUNNING, 30, "held run")
    running = run_ductor(settings, "runs", "retry", held)
    assert running.returncode == 1
    assert f"run {held!r} is running, not failed; only a failed run can be retried" in (
        running.stderr
    )
    (app_dir / "hold").unlink()
    assert client.wait_for_run(settings, held, timeout_s=60).status is RunStatus.SUCCEEDED

    (app_dir / "gate-closed").unlink()
    retried = run_ductor(settings, "runs", "retry", run_id)
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout == f"run {run_id} resumed; running again: gate, last\n"
    shown = run_ductor(settings, "result", run_id, "--wait", "60")
    assert (shown.returncode, shown.stdout) == (0, "null\n"), shown.stderr
    assert step_attempts(pg, run_id) == {
        "first": [(1, "succeeded")],
        "gate": [(1, "failed"), (2, "failed"), (3, "succeeded")],
        "last": [(1, "succeeded")],
    }
    assert client.get_run(settings, run_id).failure_reason is None
    inspected = run_ductor(settings, "inspect", run_id)
    assert inspected.returncode == 0, inspected.stdout
    gate_line = next(line for line in inspected.stdout.splitlines() if "gate " in line)
    assert " ".join(gate_line.split()[1:]) == "succeeded attempt 3 (retried after attempt 2)"
    assert_transitions_applied_once(pg, run_id)
    assert_results_applied(pg, [run_id])
    outbox = pg.execute("SELECT count(*) FROM eec_outbox WHERE run_id = %s", (run_id,))
    assert outbox.fetchone() == (0,)  # the retry's wakeup was sent, and its row deleted

    again = run_ductor(settings, "runs", "retry", run_id)
    assert again.returncode == 1 and "is succeeded, not failed" in again.stderr
    unknown = run_ductor(settings, "runs", "retry", f"nobody-{tag}")
    assert unknown.returncode == 1 and "no run with id" in unknown.stderr
    assert app_worker.proc.poll() is None, "the worker exited"
    log = (app_dir / "worker.log").read_bytes().splitlines()
    started = [orjson.loads(line) for line in log if b'"worker started"' in line]
    assert started and started[0]["step_types"] == ["echo", "gate", "hold"]


def test_two_retries_of_one_run_race_and_exactly_one_resumes_it(
    settings: Settings, audit: psycopg.Connection[Any], base_settings: Settings
) -> None:
    """Both retries load the failed run at the same version; their commits queue behind a row
    lock the test holds, so the second one loses the version race for certain. It reads the
    run again, finds it running, and is refused; the run moved by one transition only."""
    pg = audit
    run_id = f"raced-{uuid.uuid4().hex[:6]}"
    insert_runs(pg, sample_workflow(), [(run_id, {})], "t1")
    loaded = load_runs(pg, Definitions(), [run_id])[run_id]
    assert isinstance(loaded, LoadedRun)
    failed = force_fail(loaded.state, "stuck")  # as the watchdog fails a stuck run
    assert failed is not None
    assert force_fail_write(pg, run_id, loaded.stored_checksum, failed).written

    outcomes: list[object] = []

    def retry() -> None:
        try:
            outcomes.append(client.retry_run(settings, run_id))
        except client.ClientError as exc:
            outcomes.append(exc)

    with psycopg.connect(base_settings.pg_dsn) as holder:
        holder.execute("SELECT 1 FROM eec_workflow_run WHERE run_id = %s FOR UPDATE", (run_id,))
        threads = [threading.Thread(target=retry) for _ in range(2)]
        for thread in threads:
            thread.start()
        wait_for(lambda: _waiting_for_a_lock(pg) == 2, 30, "both retries to wait for the row lock")
        holder.rollback()
    for thread in threads:
        thread.join(60)
    resumed = [o for o in outcomes if isinstance(o, client.RetriedRun)]
    refused = [o for o in outcomes if isinstance(o, client.RetryRefused)]
    assert len(resumed) == 1 and len(refused) == 1, outcomes
    assert resumed[0].steps == ("fetch", "transform", "enrich", "publish")
    assert resumed[0].seq == failed.seq + 1
    assert f"run {run_id!r} is running, not failed" in str(refused[0])
    assert assert_transitions_applied_once(pg, run_id) == 2  # the force-fail and one resume


def _waiting_for_a_lock(pg: psycopg.Connection[Any]) -> int:
    row = pg.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ).fetchone()
    return int(row[0]) if row else 0
