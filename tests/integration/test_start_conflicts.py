"""Starting is explicit about conflicts (client.start_runs, `ductor start`), on the real
database and broker: a run id of another workflow is refused, a start with another input is
refused unless --if-exists ignore, an identical start is the same run, and a batch that meets
a conflict still starts its other runs."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from processor import client
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres.runs_admin import ExistingRun, insert_runs
from processor.io.postgres.workflows import register_workflow

from .children import run_ductor
from .samples import sample_workflow

pytestmark = pytest.mark.integration


def _stored_input(pg: psycopg.Connection[Any], run_id: str) -> Any:
    row = pg.execute("SELECT input FROM eec_workflow_run WHERE run_id = %s", (run_id,)).fetchone()
    return None if row is None else row[0]


def test_insert_runs_reports_what_it_found_in_one_statement(
    settings: Settings, pg: psycopg.Connection[Any]
) -> None:
    tag = uuid.uuid4().hex[:6]
    wf = sample_workflow()
    first = insert_runs(pg, wf, [(f"a-{tag}", {"x": 1, "y": [1, 2]}), (f"b-{tag}", {})], "t1")
    assert sorted(first.created) == [f"a-{tag}", f"b-{tag}"] and first.existing == []
    again = insert_runs(
        pg,
        wf,
        [(f"a-{tag}", {"y": [1, 2], "x": 1}), (f"b-{tag}", {"n": 1}), (f"c-{tag}", {})],
        "t1",
    )
    assert again.created == [f"c-{tag}"]
    assert sorted(again.existing, key=lambda e: e.run_id) == [
        ExistingRun(f"a-{tag}", ("sample", wf.version), same_input=True),  # key order is no matter
        ExistingRun(f"b-{tag}", ("sample", wf.version), same_input=False),
    ]
    assert _stored_input(pg, f"b-{tag}") == {}  # left as it was


def test_the_client_refuses_a_conflicting_start_and_says_why(
    settings: Settings, pg: psycopg.Connection[Any]
) -> None:
    other = f"other-{uuid.uuid4().hex[:6]}"  # (definitions are kept between tests)
    register_workflow(
        pg,
        parse_workflow({"name": other, "version": 1, "steps": [{"name": "only", "type": "fast"}]}),
    )
    run_id = f"order-{uuid.uuid4().hex[:6]}"
    assert client.start_run(settings, "sample", run_id, {"n": 1}).created
    # The same start again is the same run.
    assert client.start_run(settings, "sample", run_id, {"n": 1}) == client.StartedRun(
        run_id, created=False
    )
    # Another input: refused by default, said with the way to keep the existing run.
    with pytest.raises(client.RunExists) as info:
        client.start_run(settings, "sample", run_id, {"n": 2})
    assert str(info.value) == (
        f"run {run_id!r} exists already with another input; if_exists=ignore keeps the"
        " existing run, or start this one under another id"
    )
    assert info.value.existing[0].same_input is False
    started = client.start_run(settings, "sample", run_id, {"n": 2}, if_exists="ignore")
    assert started == client.StartedRun(run_id, created=False)
    assert _stored_input(pg, run_id) == {"n": 1}
    # fail: any existing run id is refused, even an identical start.
    with pytest.raises(client.RunExists, match=r"exists already \(if_exists=fail\)"):
        client.start_run(settings, "sample", run_id, {"n": 1}, if_exists=client.IfExists.FAIL)
    # Another workflow: refused whatever the policy.
    for policy in (None, "ignore", "fail"):
        with pytest.raises(client.RunExists, match="exists already, of workflow 'sample'"):
            client.start_run(settings, other, run_id, {"n": 1}, if_exists=policy)
    with pytest.raises(client.ClientError, match="if_exists must be one of ignore, fail"):
        client.start_run(settings, "sample", run_id, if_exists="replace")


def test_a_batch_that_meets_a_conflict_starts_its_other_runs(
    settings: Settings, pg: psycopg.Connection[Any]
) -> None:
    tag = uuid.uuid4().hex[:6]
    taken = f"taken-{tag}"
    client.start_run(settings, "sample", taken, {"n": 1})
    fresh = [f"fresh-{tag}-{i}" for i in range(3)]
    with pytest.raises(client.RunExists) as info:
        client.start_runs(settings, "sample", [fresh[0], taken, *fresh[1:]], {"n": 9})
    assert [e.run_id for e in info.value.existing] == [taken]
    assert sorted(info.value.inserted) == fresh
    assert all(_stored_input(pg, r) == {"n": 9} for r in fresh)


def test_ductor_start_refuses_a_conflict_with_one_sentence_and_exit_1(
    settings: Settings, pg: psycopg.Connection[Any]
) -> None:
    run_id = f"cli-{uuid.uuid4().hex[:6]}"
    elsewhere = f"elsewhere-{uuid.uuid4().hex[:6]}"
    first = run_ductor(settings, "start", "sample", "--run-id", run_id, "--input", '{"n": 1}')
    assert (first.returncode, first.stdout) == (0, f"{run_id}\n"), first.stderr
    same = run_ductor(settings, "start", "sample", "--run-id", run_id, "--input", '{ "n":1 }')
    assert (same.returncode, same.stdout) == (0, f"{run_id} (already started)\n"), same.stderr

    other = run_ductor(settings, "start", "sample", "--run-id", run_id, "--input", '{"n": 2}')
    assert other.returncode == 1
    assert other.stderr == (
        f"ductor: run {run_id!r} exists already with another input; --if-exists ignore keeps"
        " the existing run, or start this one under another --run-id\n"
    )
    kept = run_ductor(
        settings,
        "start",
        "sample",
        "--run-id",
        run_id,
        "--input",
        '{"n": 2}',
        "--if-exists",
        "ignore",
    )
    assert (kept.returncode, kept.stdout) == (0, f"{run_id} (already started)\n"), kept.stderr
    strict = run_ductor(settings, "start", "sample", "--run-id", run_id, "--if-exists", "fail")
    assert strict.returncode == 1
    assert strict.stderr == f"ductor: run {run_id!r} exists already (--if-exists fail)\n"
    assert _stored_input(pg, run_id) == {"n": 1}

    register_workflow(
        pg,
        parse_workflow(
            {"name": elsewhere, "version": 1, "steps": [{"name": "only", "type": "fast"}]}
        ),
    )
    foreign = run_ductor(settings, "start", elsewhere, "--run-id", run_id, "--if-exists", "ignore")
    assert foreign.returncode == 1
    assert foreign.stderr == (
        f"ductor: run {run_id!r} exists already, of workflow 'sample': a run id belongs to one"
        f" workflow; start {elsewhere!r} under another --run-id\n"
    )
