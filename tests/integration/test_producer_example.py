"""The Go producer of examples/producer-go, built with the machine's Go and run as a team's
service would run it: nothing but a Kafka client starts and cancels runs. Run twice, as a
producer retrying after a timeout would: still one run per start, one signal per id. And its
README's block as written, in a user's shell at a copy of the repository's top (as
test_example_readmes.py follows the other examples): `go build`, then the program, whose runs
of the orders workflow start and are cancelled. Both need Go; without it they are skipped,
saying so (the build, started with the suite, finds no `go`)."""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.kafka.dlq import read_dead_letters
from processor.io.postgres.workflows import register_workflow
from tests.readme_script import commands

from .background_builds import PRODUCER, go_binary
from .runs import run_statuses
from .samples import REPO, SAMPLE
from .user_shell import Shell
from .waiting import wait_for

pytestmark = pytest.mark.integration

RUNS = 5
LINE = re.compile(r"^(start|cancel) (\S+) -> partition \d+ offset \d+$")
EXAMPLE = REPO / "examples" / "producer-go"


@pytest.fixture(scope="module")
def producer_binary() -> Path:
    built = PRODUCER.output()  # (its build started with the suite: background_builds.py)
    if built is None:
        pytest.skip("Go is not installed: the Go producer example cannot be built")
    return built / "ductor-producer"


def _produce(
    binary: Path, settings: Settings, workflow: str, run_prefix: str
) -> list[tuple[str, str]]:
    done = subprocess.run(
        [
            str(binary),
            "-workflow",
            workflow,
            "-runs",
            str(RUNS),
            "-cancel",
            "-run-prefix",
            run_prefix,
        ],
        env={
            **os.environ,
            "DUCTOR_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
            "DUCTOR_TOPIC_PREFIX": settings.topic_prefix,
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    matches = [LINE.match(line) for line in done.stdout.splitlines()]
    assert all(matches), done.stdout
    return sorted((m.group(1), m.group(2)) for m in matches if m)


def test_the_go_producer_starts_and_cancels_runs_once_however_often_it_runs(
    settings: Settings, audit: psycopg.Connection[Any], processor_thread: Any, producer_binary: Path
) -> None:
    pg = audit
    workflow = {**orjson.loads(SAMPLE.read_bytes()), "name": f"go-{uuid.uuid4().hex[:8]}"}
    register_workflow(pg, parse_workflow(workflow))
    processor_thread(settings)
    run_ids = [f"go-{i}" for i in range(1, RUNS + 1)]
    for _ in range(2):
        produced = _produce(producer_binary, settings, workflow["name"], "go")
        assert produced == sorted(
            [*(("start", r) for r in run_ids), *(("cancel", r) for r in run_ids)]
        )
        wait_for(
            lambda: run_statuses(pg, run_ids) == dict.fromkeys(run_ids, "cancelled"),
            60,
            "every run the Go producer started to be cancelled",
        )
    signals = pg.execute(
        "SELECT run_id, signal_id FROM eec_run_signal WHERE run_id = ANY(%s) ORDER BY run_id",
        (run_ids,),
    ).fetchall()
    assert signals == [(r, f"{r}:cancel") for r in sorted(run_ids)]
    assert pg.execute("SELECT count(*) FROM eec_workflow_run").fetchone() == (RUNS,)
    assert read_dead_letters(settings) == []


def test_the_readme_s_block_builds_and_runs_as_written(
    settings: Settings,
    pg: psycopg.Connection[Any],
    processor_thread: Any,
    producer_binary: Path,
    top: Path,
    shell: Shell,
) -> None:
    """The README's commands as a user types them (`cd`, `go build`, the program with the
    README's flags), the user's Go on the PATH and Ductor's settings in the environment; the
    program prints a line per record, and the runs it starts of the orders workflow (the
    README's `-workflow orders`) are there and cancelled."""
    assert producer_binary.is_file()  # Go builds here (and its module cache is filled)
    steps = commands((EXAMPLE / "README.md").read_text())
    assert [c.text.split()[0] for c in steps] == ["cd", "go", "./ductor-producer"], steps
    assert not any(c.expected is not None or c.background for c in steps)
    workflow = orjson.loads((REPO / "examples" / "orders" / "workflow.json").read_bytes())
    register_workflow(pg, parse_workflow(workflow))
    processor_thread(settings)
    go = go_binary()
    assert go is not None
    assert shell.run(f'export PATH="$PATH:{go.parent}"')[1] == 0  # where the user has Go
    *typed, last = steps
    shell.follow(typed, "examples/producer-go/README.md", top)
    printed, status = shell.run(last.text)
    assert status == 0, printed
    matched = [LINE.match(line) for line in printed]
    assert all(matched), printed
    run_ids = [f"go-producer-{i}" for i in (1, 2, 3)]
    assert sorted((m.group(1), m.group(2)) for m in matched if m) == sorted(
        [*(("start", r) for r in run_ids), *(("cancel", r) for r in run_ids)]
    )
    assert (top / "examples" / "producer-go" / "ductor-producer").is_file()
    wait_for(
        lambda: run_statuses(pg, run_ids) == dict.fromkeys(run_ids, "cancelled"),
        60,
        "the README's runs to start and be cancelled",
    )
    assert read_dead_letters(settings) == []
