"""How `ductor inspect` shows a run's output (processor/cli/runs.py: output_text)."""

from __future__ import annotations

import orjson

from processor.cli.runs import INSPECT_OUTPUT_CHARS, output_text
from processor.core.run_state import RunStatus
from processor.io.postgres.runs_admin import RunResult


def test_a_succeeded_runs_output_is_shown_as_compact_json() -> None:
    output = {"confirmation": {"order_id": "1001"}, "charges": {"total_cents": 4634}}
    shown = output_text(RunResult("r", RunStatus.SUCCEEDED, output, None))
    assert orjson.loads(shown) == output and " " not in shown
    # A workflow that declares no output: the run succeeded with none.
    assert output_text(RunResult("r", RunStatus.SUCCEEDED, None, None)) == "null"


def test_a_run_that_has_not_succeeded_shows_no_output() -> None:
    for status in (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.FAILED, RunStatus.CANCELLED):
        assert output_text(RunResult("r", status, None, "why")) == "-"


def test_a_long_output_is_cut_and_says_where_to_read_it_whole() -> None:
    output = {"blob": "x" * 5000}
    whole = orjson.dumps(output).decode()
    shown = output_text(RunResult("order-9", RunStatus.SUCCEEDED, output, None))
    assert shown.startswith(whole[:INSPECT_OUTPUT_CHARS] + " ... ")
    assert shown.endswith(f"({len(whole)} characters; `ductor result order-9` prints it whole)")
    exact = {"k": "y" * (INSPECT_OUTPUT_CHARS - len('{"k":""}'))}
    assert (
        output_text(RunResult("r", RunStatus.SUCCEEDED, exact, None))
        == orjson.dumps(exact).decode()
    )
