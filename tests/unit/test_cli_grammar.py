"""The command line's one grammar, without services: the global -o/--output before or after
the command (one option: no command has its own), --input @FILE and -, a bare `ductor` and
`ductor help`, shell completion, and the exit-code table `ductor --help` prints."""

from __future__ import annotations

import argparse
import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from processor.cli.common import EXIT_USAGE, CliError, json_argument
from processor.cli.grammar import leaf_parsers, resolve_output
from processor.cli.main import build_parser, main, parse_args
from processor.cli.schedules import COLUMNS
from processor.io.runtime.exit_codes import EXIT_ABANDONED, EXIT_KAFKA_FATAL, EXIT_STOP_OVERRAN


def _resolved(argv: list[str]) -> argparse.Namespace:
    args = parse_args(argv)
    resolve_output(args)
    return args


@pytest.mark.parametrize(
    ("argv", "output"),
    [
        (["inspect", "r"], "text"),
        (["-o", "json", "inspect", "r"], "json"),
        (["--output", "json", "inspect", "r"], "json"),
        (["inspect", "r", "-o", "json"], "json"),
        (["inspect", "r", "--output", "json"], "json"),
        (["-o", "json", "inspect", "r", "-o", "text"], "text"),  # the later one wins
        (["-o", "json", "runs", "list"], "json"),
        (["runs", "list", "-o", "json"], "json"),
        (["result", "r", "-o", "json"], "json"),
        (["schedules", "pause", "nightly", "-o", "json"], "json"),
        (["config", "check", "-o", "json"], "json"),
    ],
)
def test_the_output_is_one_option_before_or_after_the_command(
    argv: list[str], output: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _resolved(argv)
    assert args.output == output
    assert capsys.readouterr().err == ""  # no note on stderr


def test_every_command_but_the_services_takes_the_output_option() -> None:
    refused = set()
    for leaf in leaf_parsers(build_parser()):
        options = {s for action in leaf._actions for s in action.option_strings}
        if leaf.get_default("json_refused") is not None:
            refused.add(leaf.prog)
            assert "-o" not in options, leaf.prog
        else:
            assert "-o" in options and "--output" in options, leaf.prog
    assert refused == {
        "ductor process",
        "ductor worker",
        "ductor ui",
        "ductor demo",
        "ductor bench",
    }


@pytest.mark.parametrize(
    "command", [["runs", "list"], ["workflows", "list"], ["workers"], ["schedules", "list"]]
)
def test_the_list_commands_have_no_output_option_of_their_own(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Their former `--output table|json` is gone: `--output` after them is the global option
    (json prints JSON lines, as -o json does), and `table` is refused as a usage error."""
    parser = build_parser()
    (leaf,) = [leaf for leaf in leaf_parsers(parser) if leaf.prog == f"ductor {' '.join(command)}"]
    (output,) = [a for a in leaf._actions if "--output" in a.option_strings]
    assert output.option_strings == ["-o", "--output"] and output.dest == "output"
    for spelling in ("-o", "--output"):
        args = _resolved([*command, spelling, "json"])
        assert args.output == "json" and not hasattr(args, "legacy_json")
        assert _resolved(["--output", "json", *command, spelling, "text"]).output == "text"
    assert capsys.readouterr().err == ""
    with pytest.raises(SystemExit) as info:
        parse_args([*command, "--output", "table"])
    assert info.value.code == EXIT_USAGE
    assert "invalid choice: 'table'" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["process"], ["worker"], ["ui"], ["demo"]])
def test_a_service_refuses_json_output_with_exit_2(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["-o", "json", *command]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"`ductor {command[0]}` takes no -o json" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv", [[], ["-o", "json"]])
def test_a_bare_ductor_prints_the_help_and_exits_0(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ductor")
    for command in ("start", "runs", "schedules", "completion", "help"):
        assert f"\n    {command} " in out


def test_the_help_prints_the_exit_code_table(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    table = out[out.index("exit codes (every command):") :]
    for code in ("0  done", "1  the operation failed", "2  refused input", "3  not finished"):
        assert code in table


def test_help_of_a_command_and_of_no_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["help", "runs", "list"]) == 0
    assert capsys.readouterr().out.startswith("usage: ductor runs list")
    assert main(["help"]) == 0
    assert capsys.readouterr().out.startswith("usage: ductor [-h]")
    assert main(["help", "runs", "nope"]) == EXIT_USAGE
    assert "no command 'runs nope'" in capsys.readouterr().err


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_scripts_name_every_command(
    shell: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # No settings are read: completion works with a broken environment.
    monkeypatch.setenv("DUCTOR_WAKEUP_PARTITIONS", "not a number")
    assert main(["completion", shell]) == 0
    script = capsys.readouterr().out
    for word in ("schedules", "completion", "--wait", "--output", "--if-exists", "succeeded"):
        assert word in script, word
    if shell == "bash":
        syntax = subprocess.run(
            ["bash", "-n"], input=script, text=True, capture_output=True, check=False
        )
        assert syntax.returncode == 0, syntax.stderr


def test_start_wait_takes_seconds_or_none() -> None:
    assert parse_args(["start", "w"]).wait is None
    assert parse_args(["start", "w", "--wait"]).wait == float("inf")
    assert parse_args(["start", "w", "--wait", "2.5"]).wait == 2.5
    assert parse_args(["start", "w", "--wait", "5", "--input", "@in.json"]).input == "@in.json"


def test_json_arguments_read_a_file_or_stdin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "in.json").write_text('{"n": 3}\n')
    assert json_argument("--input", f"@{tmp_path / 'in.json'}", {}) == {"n": 3}
    monkeypatch.setattr(sys, "stdin", io.StringIO('[1, "two"]'))
    assert json_argument("--input", "-", {}) == [1, "two"]
    assert json_argument("--input", '{"a": 1}', {}) == {"a": 1}
    assert json_argument("--input", None, {}) == {}
    assert json_argument("--input", "", {}) == {}


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("@{dir}/missing.json", "cannot read"),
        ("@{dir}/bad.json", "is not valid JSON"),
        ("@{dir}/latin1.json", "is not UTF-8"),
        ("@{dir}", "cannot read"),
    ],
)
def test_a_json_argument_that_cannot_be_read_is_refused_with_exit_2(
    tmp_path: Path, given: str, message: str
) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "latin1.json").write_bytes(b'"caf\xe9"')
    with pytest.raises(CliError, match=message) as info:
        json_argument("--input", given.format(dir=tmp_path), {})
    assert info.value.code == EXIT_USAGE


def test_schedules_list_explains_each_of_its_columns(capsys: pytest.CaptureFixture[str]) -> None:
    """The table's header and its --help come from one list: every column shown is explained."""
    with pytest.raises(SystemExit) as done:
        main(["schedules", "list", "--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    explained = shown[shown.index("columns:") :].splitlines()[1:]
    names = [name for name, _ in COLUMNS]
    assert names[:3] == ["NAME", "CRON", "WORKFLOW"] and "MISSED" in names
    for name in names:
        (line,) = [line for line in explained if line.strip().startswith(name + "  ")]
        assert len(line.split(name, 1)[1].strip()) > 10, line


def test_a_service_stops_itself_with_codes_of_its_own_that_the_table_lists(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A service stopping itself for a fresh process (or ended past its shutdown bound) never
    says 0-3, a command's codes (3 is "not finished"), and the reasons differ; `ductor
    --help` and docs/usage.md list each."""
    service_codes = {EXIT_KAFKA_FATAL, EXIT_ABANDONED, EXIT_STOP_OVERRAN}
    assert len(service_codes) == 3 and not service_codes & {0, 1, 2, 3}
    assert EXIT_STOP_OVERRAN == 128 + signal.SIGALRM  # what the shell says of its end
    with pytest.raises(SystemExit):
        main(["--help"])
    shown = capsys.readouterr().out
    usage = (Path(__file__).parents[2] / "docs" / "usage.md").read_text()
    for code in service_codes:
        assert f"\n  {code}  " in shown, code
        assert f"\n| {code} | " in usage, code


def test_bench_refuses_a_bad_count_as_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(["bench", "--build-rounds", "0"])
    assert info.value.code == EXIT_USAGE
    assert "--build-rounds: must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["completion", "bash"], ["completion", "zsh"]])
def test_a_reader_that_goes_away_ends_the_command_without_a_word(argv: list[str]) -> None:
    """`ductor ... | head`: the pipe's reader closed before the command wrote; the command
    says nothing (no "Broken pipe", no error as the interpreter exits) and exits 141, as a
    tool killed by SIGPIPE does."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command writes a byte
    with subprocess.Popen(
        [sys.executable, "-m", "processor", *argv], stdout=write, stderr=subprocess.PIPE
    ) as child:
        os.close(write)
        _, stderr = child.communicate(timeout=60)
    assert (child.returncode, stderr.decode()) == (141, "")
