"""The command line parses what the README and the docs show, and loads the demo and the
benchmark only for their own commands."""

from __future__ import annotations

import subprocess
import sys

import pytest

from processor.cli.main import parse_args


def test_bench_takes_the_benchmark_options() -> None:
    args = parse_args(["bench", "--scale", "0.5", "--hot-seconds", "3"])
    assert (args.scale, args.hot_seconds, args.hot_fraction) == (0.5, 3.0, 0.2)


def test_start_takes_count_tier_and_run_id() -> None:
    args = parse_args(["start", "sample", "--count", "3", "--tier", "t0", "--run-id", "r"])
    assert (args.workflow, args.count, args.tier, args.run_id) == ("sample", 3, "t0", "r")


def test_the_client_commands_take_what_the_docs_show() -> None:
    assert parse_args(["worker"]).app is None
    args = parse_args(["worker", "--app", "my_package.steps:registry", "--threads", "2"])
    assert (args.app, args.concurrency) == ("my_package.steps:registry", 2)
    assert parse_args(["result", "r"]).wait is None
    assert parse_args(["result", "r", "--wait", "2.5"]).wait == 2.5
    args = parse_args(["runs", "list", "--workflow", "w", "--status", "failed", "--limit", "3"])
    assert (args.workflow, args.status, args.limit) == ("w", ["failed"], 3)
    assert parse_args(["runs", "list"]).limit == 50
    assert parse_args(["runs", "retry", "r"]).run_id == "r"
    assert parse_args(["workflows", "register", "flows:checkout"]).source == "flows:checkout"
    assert parse_args(["workflows", "list"]).output is None
    args = parse_args(["workflows", "show", "checkout", "--version", "2"])
    assert (args.name, args.version) == ("checkout", 2)
    args = parse_args(["ui"])
    assert (args.host, args.port, args.handles_signals) == ("127.0.0.1", 8080, True)
    assert parse_args(["ui", "--host", "::1", "--port", "0"]).host == "::1"


@pytest.mark.parametrize(
    "argv",
    [
        ["start", "sample", "--bogus"],
        ["bench", "--bogus"],
        ["inspect"],
        ["result"],
        ["runs", "list", "--status", "done"],
        ["runs", "retry", "--max", "many"],
        ["runs", "count", "--tag"],
        ["workflows", "show"],
        ["workflows", "list", "--output", "yaml"],
        ["workflows", "list", "--output", "table"],
        ["runs", "list", "--output", "table"],
        ["ui", "--port", "http"],
    ],
)
def test_bad_usage_exits_2_with_a_usage_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2
    assert capsys.readouterr().err.startswith("usage: ductor")


def test_bench_help_lists_the_benchmark_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(["bench", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ductor bench")
    assert "--hot-fraction" in out


def test_the_command_line_does_not_load_the_demo_or_the_benchmark() -> None:
    """`ductor --help` and every command but demo and bench start without processor.tools,
    and without the web page's libraries (the ui extra, loaded by `ductor ui` alone)."""
    code = (
        "import contextlib, io, sys\n"
        "import processor.cli\n"
        "from processor.cli.main import parse_args\n"
        "for argv in (['start', 'x'], ['process'], ['dlq', 'list'], ['inspect', 'r'], ['ui']):\n"
        "    parse_args(argv)\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "    parse_args(['--help'])\n"
        "lazy = ('processor.tools', 'processor.ui', 'starlette', 'uvicorn', 'jinja2')\n"
        "print(sorted(n for n in sys.modules if n.startswith(lazy)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"
