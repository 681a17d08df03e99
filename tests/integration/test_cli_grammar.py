"""The command line's one grammar on the real services: `start --wait` prints the run's
result with an exit code by its outcome, `--input @FILE` and `--input -` (stdin) give the
stored input, `-o json` prints JSON (one object a line for a list) command by command, and
every command family exits by the one table (grammar.EXIT_TABLE; docs/usage.md#exit-codes).

The commands run in this process through ``main`` (the environment of a `ductor` child,
the services real), but for stdin, which a child reads as a user pipes it."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from processor.cli.main import main
from processor.core.routing import TopicNames
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres.workflows import register_workflow
from processor.tools.child import ductor_command

from .children import child_env
from .instances import WorkerThread
from .samples import REPO

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Done:
    code: int
    out: str
    err: str

    def json_lines(self) -> list[Any]:
        return [orjson.loads(line) for line in self.out.splitlines()]


Ductor = Callable[..., Done]


@pytest.fixture
def ductor(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Iterator[Ductor]:
    """`ductor ARGS...` in this process with the environment a child of ``settings`` gets."""
    for name, value in child_env(settings).items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()

    def run(*argv: str) -> Done:
        code = main(list(argv))
        captured = capsys.readouterr()
        return Done(code, captured.out, captured.err)

    yield run


def _stored_input(pg: psycopg.Connection[Any], run_id: str) -> Any:
    row = pg.execute("SELECT input FROM eec_workflow_run WHERE run_id = %s", (run_id,)).fetchone()
    assert row is not None, run_id
    return row[0]


def test_start_wait_prints_the_result_with_an_exit_code_by_outcome(
    settings: Settings,
    pg: psycopg.Connection[Any],
    processor_thread: Any,
    ductor: Ductor,
    tmp_path: Path,
) -> None:
    only = {"name": "only", "type": "fail", "retry": {"max_attempts": 1}}
    register_workflow(pg, parse_workflow({"name": "failing", "version": 1, "steps": [only]}))
    (tmp_path / "input.json").write_text('{"order": 17, "lines": ["a", "b"]}\n')
    processor_thread(settings)
    worker = WorkerThread(settings)
    try:
        done = ductor(
            "start",
            "sample",
            "--run-id",
            "ok",
            "--input",
            f"@{tmp_path}/input.json",
            "--wait",
            "60",
        )
        assert (done.code, done.out) == (0, "null\n"), done.err
        assert "run ok started; waiting for its end" in done.err
        assert _stored_input(pg, "ok") == {"order": 17, "lines": ["a", "b"]}

        done = ductor("-o", "json", "start", "failing", "--run-id", "bad", "--wait")
        assert done.code == 1, done.err
        (result,) = done.json_lines()
        assert (result["run_id"], result["status"], result["finished"]) == ("bad", "failed", True)
        assert "step 'only' failed" in result["failure_reason"]
        assert "run bad failed: step 'only' failed" in done.err

        # Started again: the same run, waited for again (it has ended: at once).
        done = ductor(
            "start",
            "sample",
            "--run-id",
            "ok",
            "--input",
            f"@{tmp_path}/input.json",
            "--wait",
            "5",
            "-o",
            "json",
        )
        assert done.code == 0 and done.json_lines()[0]["status"] == "succeeded"
    finally:
        worker.stop()

    # stdin, as a user pipes it to the installed command.
    command, where = ductor_command(), REPO
    piped = subprocess.run(
        [*command, "start", "sample", "--run-id", "piped", "--input", "-", "-o", "json"],
        input='{"from": "stdin"}',
        env=child_env(settings),
        cwd=where,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert piped.returncode == 0, piped.stderr
    assert orjson.loads(piped.stdout) == {"run_id": "piped", "created": True}
    assert _stored_input(pg, "piped") == {"from": "stdin"}


def test_start_wait_exits_3_while_the_run_has_not_ended(ductor: Ductor) -> None:
    """No processor runs: the run stays pending."""
    done = ductor("start", "sample", "--run-id", "later", "--wait", "0.2")
    assert done.code == 3
    assert "run 'later' is still pending after 0.2 s; not finished" in done.err
    assert ductor("result", "later").code == 3
    assert ductor("result", "later", "--wait", "0.1", "-o", "json").code == 3
    assert ductor("start", "sample", "--count", "2", "--wait").code == 2
    assert ductor("start", "sample", "--wait", "-1").code == 2


# Every command family's failures, each with the code of the table: 2 refused input (an
# unknown workflow wherever it is named), 1 not found or failed, 3 not finished.
EXIT_CODES: list[tuple[list[str], int]] = [
    (["start", "nope"], 2),
    (["start", "sample", "--input", "{not json"], 2),
    (["start", "sample", "--input", "@/nonexistent/input.json"], 2),
    (["start", "sample", "--tag", "nokey"], 2),
    (["start", "sample", "--run-id", "r" * 201], 2),
    (["start", "sample", "--run-id", "r" * 201, "--via", "kafka"], 2),
    (["signal", "r" * 201, "go"], 2),
    (["schedules", "create", "s1", "--cron", "* * * * *", "--workflow", "nope"], 2),
    (
        [
            "schedules",
            "create",
            "s1",
            "--cron",
            "* * * * *",
            "--workflow",
            "sample",
            "--input",
            "@/nonexistent",
        ],
        2,
    ),
    (["workflows", "show", "nope"], 2),
    (["workflows", "register", "/nonexistent.json"], 2),
    (["runs", "list", "--limit", "0"], 2),
    (["runs", "cancel"], 2),
    (["gc", "--finished-before", "soon"], 2),
    (["dlq", "list", "--limit", "0"], 2),
    (["signal", "pending-run", "bad name!"], 2),
    (["inspect", "nobody"], 1),
    (["result", "nobody"], 1),
    (["result", "nobody", "--wait", "1"], 1),
    (["signal", "nobody", "go"], 1),
    (["runs", "retry", "nobody"], 1),
    (["runs", "release", "nobody"], 1),
    (["schedules", "pause", "nope"], 1),
    (["schedules", "delete", "nope"], 1),
    (["triggers", "delete", "nope"], 1),
    (["runs", "retry", "pending-run"], 1),
    (["result", "pending-run"], 3),
    (["workflows", "list"], 0),
    (["runs", "count"], 0),
    (["inspect", "pending-run"], 0),
]


def _named_topics(settings: Settings) -> list[tuple[list[str], int]]:
    """What names a topic: one that does not exist, and one of Ductor's own (refused input)."""
    own = TopicNames(settings.topic_prefix).wakeup("t1")
    missing = f"team-missing-{uuid.uuid4().hex[:6]}"
    create = ["triggers", "create", "t1", "--workflow", "sample", "--topic"]
    return [([*create, missing], 2), ([*create, own], 2)]


def test_every_command_family_exits_by_the_one_table(
    ductor: Ductor, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert ductor("start", "sample", "--run-id", "pending-run").code == 0
    wrong = []
    for argv, code in [*EXIT_CODES, *_named_topics(settings)]:
        done = ductor(*argv)
        if done.code != code:
            wrong.append(f"ductor {' '.join(argv)}: exit {done.code}, not {code} ({done.err!r})")
        elif code:
            # A failure is one sentence on stderr, never a traceback.
            assert done.err.startswith(("ductor: ", "run ")), (argv, done.err)
            assert "Traceback" not in done.err, argv
    assert not wrong, "\n".join(wrong)
    # Topics that were never created (a prefix of nobody's): configuration, exit 2.
    monkeypatch.setenv("DUCTOR_TOPIC_PREFIX", f"nobody{uuid.uuid4().hex[:6]}")
    done = ductor("dlq", "list")
    assert done.code == 2 and "does not exist" in done.err, done


def test_json_output_command_by_command(ductor: Ductor, pg: psycopg.Connection[Any]) -> None:
    started = ductor("-o", "json", "start", "sample", "--run-id", "r1", "--tag", "team=a")
    assert started.json_lines() == [{"run_id": "r1", "created": True}]
    many = ductor("start", "sample", "--run-id", "m", "--count", "2", "-o", "json")
    assert many.json_lines() == [
        {"run_id": "m-0", "created": True},
        {"run_id": "m-1", "created": True},
    ]
    listed = ductor("runs", "list", "-o", "json").json_lines()
    assert sorted(run["run_id"] for run in listed) == ["m-0", "m-1", "r1"]
    assert {run["status"] for run in listed} == {"pending"}
    assert ductor("runs", "count", "--tag", "team=a", "-o", "json").json_lines() == [{"count": 1}]
    (document,) = ductor("inspect", "r1", "-o", "json").json_lines()
    assert document["run_id"] == "r1"
    pending = ductor("-o", "json", "result", "r1", "--wait", "0")
    assert pending.code == 3  # not finished; where it stands, on stdout all the same
    assert (pending.json_lines()[0]["status"], pending.json_lines()[0]["finished"]) == (
        "pending",
        False,
    )

    (sent,) = ductor("signal", "r1", "cancel", "--signal-id", "s1", "-o", "json").json_lines()
    assert sent == {"run_id": "r1", "signal_id": "s1", "new": True}

    workflows = ductor("workflows", "list", "-o", "json").json_lines()
    assert ("sample", 1) in [(w["name"], w["version"]) for w in workflows]  # and earlier tests
    (shown,) = ductor("workflows", "show", "sample", "-o", "json").json_lines()
    assert shown["name"] == "sample"

    created = ductor(
        "-o",
        "json",
        "schedules",
        "create",
        "nightly",
        "--cron",
        "0 3 * * *",
        "--workflow",
        "sample",
        "--input",
        '{"n": 1}',
    )
    (schedule,) = created.json_lines()
    assert schedule["name"] == "nightly" and len(schedule["next_fires"]) == 3
    assert [s["name"] for s in ductor("schedules", "list", "-o", "json").json_lines()] == [
        "nightly"
    ]
    paused = ductor("schedules", "pause", "nightly", "-o", "json").json_lines()
    assert paused == [{"name": "nightly", "changed": True}]
    deleted = ductor("schedules", "delete", "nightly", "-o", "json").json_lines()
    assert deleted == [{"name": "nightly", "deleted": True}]
    assert ductor("schedules", "list", "-o", "json").out == ""  # an empty list: no line

    cancelled = ductor("-o", "json", "runs", "cancel", "--id-prefix", "m-").json_lines()
    assert sorted(cancelled[0]["matched"]) == ["m-0", "m-1"]
    assert ductor("triggers", "list", "-o", "json").out == ""
    assert ductor("workers", "-o", "json").out == ""
    (config,) = ductor("config", "show", "-o", "json").json_lines()
    assert "settings" in config


@pytest.mark.parametrize(
    "command", [["runs", "list"], ["workflows", "list"], ["workers"], ["schedules", "list"]]
)
def test_output_after_a_list_command_is_the_one_option(ductor: Ductor, command: list[str]) -> None:
    """`--output json` after a list command prints what `-o json` prints, anywhere: JSON
    lines, not the former single document; the former `--output table` is gone."""
    ductor("start", "sample", "--run-id", "one")
    ductor("schedules", "create", "hourly", "--cron", "0 * * * *", "--workflow", "sample")
    long = ductor(*command, "--output", "json")
    assert long.code == 0, long.err
    assert long.out == ductor(*command, "-o", "json").out == ductor("-o", "json", *command).out
    assert long.json_lines() == [orjson.loads(line) for line in long.out.splitlines()]
    if command != ["workers"]:  # no worker is live here: an empty list
        assert all(isinstance(line, dict) for line in long.json_lines()) and long.json_lines()
    assert "deprecated" not in long.err
    assert ductor(*command, "--output", "text").out == ductor(*command).out
