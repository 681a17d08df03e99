"""What a failed attempt keeps (core/failures.py, worker/steps.py): the exception's type and
message, and its traceback from the user's step code on, bounded in lines and bytes; and how a
look at a run shows values (core/shown.py) and a step's own text on a terminal
(cli/run_text.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from processor.cli.run_text import printable
from processor.core.failures import (
    MAX_ERROR_CHARS,
    MAX_TRACEBACK_BYTES,
    MAX_TRACEBACK_LINES,
    TRACEBACK_LINE_CHARS,
    bounded_error,
    bounded_traceback,
    first_user_frame,
    no_traceback,
)
from processor.core.model import StepOutcome
from processor.core.shown import Shown, shown
from processor.core.step_task import StepData, StepTask
from processor.io.postgres.run_document import error_message
from processor.worker.steps import (
    StepContext,
    StepRegistry,
    execute_async_step,
    execute_step,
    step_traceback,
)

NO_DATA = StepData({})


def _task(step_type: str) -> StepTask:
    return StepTask("r", "n", 1, step_type, deadline_ms=2**40)


def _bytes(text: str) -> int:
    return len(text.encode("utf-8", "backslashreplace"))


# -- the bounds (pure) --------------------------------------------------------------------------


def test_a_traceback_within_the_bounds_is_kept_as_it_is() -> None:
    text = "Traceback (most recent call last):\n  File \"s.py\", line 3, in f\nKeyError: 'by'\n"
    assert bounded_traceback(text) == text.rstrip("\n")


def test_a_long_traceback_keeps_its_first_lines_and_its_last_and_says_what_it_left_out() -> None:
    lines = ["Traceback (most recent call last):"]
    lines += [f'  File "deep.py", line {i}, in f{i}\n    f{i + 1}()' for i in range(500)]
    lines.append("RecursionError: maximum recursion depth exceeded")
    kept = bounded_traceback("\n".join(lines)).split("\n")
    assert len(kept) <= MAX_TRACEBACK_LINES
    assert kept[0] == "Traceback (most recent call last):"
    assert kept[1] == '  File "deep.py", line 0, in f0'  # where the user's code was entered
    assert kept[-1] == "RecursionError: maximum recursion depth exceeded"  # and what it raised
    (marker,) = [line for line in kept if "lines left out" in line]
    left_out = int(marker.split("(")[1].split()[0])
    assert left_out == 1 + 2 * 500 + 1 - (len(kept) - 1)


def test_a_long_line_is_cut_and_says_how_long_it_was() -> None:
    message = "ValueError: " + "x" * 10_000
    (line,) = bounded_traceback(message).split("\n")
    assert line.startswith(message[:TRACEBACK_LINE_CHARS])
    assert line.endswith(f"… ({len(message)} characters)")


def test_the_byte_bound_holds_for_characters_of_several_bytes() -> None:
    text = "\n".join(["€" * 300] * 70)  # 900 bytes a line: 63 KB, under the line bound
    kept = bounded_traceback(text)
    assert _bytes(kept) <= MAX_TRACEBACK_BYTES
    assert kept.split("\n")[-1] == "€" * 300


@given(
    st.lists(st.text(max_size=2000), max_size=400),
    st.integers(min_value=10, max_value=200),
    st.integers(min_value=4096, max_value=40_000),
)
def test_any_text_is_bounded_in_lines_and_bytes_and_keeps_its_last_line(
    lines: list[str], max_lines: int, max_bytes: int
) -> None:
    text = "\n".join(line.replace("\n", " ") for line in lines)
    kept = bounded_traceback(text, max_lines, max_bytes, 200)
    assert len(kept.split("\n")) <= max_lines
    assert _bytes(kept) <= max_bytes
    last = text.rstrip("\n").split("\n")[-1]
    assert kept.split("\n")[-1].startswith(last[:200])


def test_a_message_is_cut_after_its_bound() -> None:
    assert bounded_error("short") == "short"
    long = "y" * (MAX_ERROR_CHARS + 1)
    assert bounded_error(long) == f"{'y' * MAX_ERROR_CHARS}… ({MAX_ERROR_CHARS + 1} characters)"


def test_the_first_user_frame_is_the_first_not_in_the_workers_files() -> None:
    own = {"/w/steps.py"}
    assert first_user_frame(["/w/steps.py", "/app/s.py", "/w/steps.py"], own) == 1
    assert first_user_frame(["/app/s.py"], own) == 0
    assert first_user_frame(["/w/steps.py", "/w/steps.py"], own) == 0  # all the worker's: all


# -- what the worker keeps of a step's exception ------------------------------------------------


def _charge_registry() -> StepRegistry:
    registry = StepRegistry()

    def lookup(order: dict[str, Any]) -> Any:
        return order["by"]

    @registry.step("charge")
    def charge(ctx: StepContext) -> Any:
        return lookup({})

    @registry.step("charge_async")
    async def charge_async(ctx: StepContext) -> Any:
        await asyncio.sleep(0)
        return lookup({})

    return registry


def _frames(trace: str) -> list[str]:
    return [line.strip() for line in trace.split("\n") if line.strip().startswith("File ")]


def test_a_step_raising_keeps_its_type_message_and_traceback_from_the_users_function() -> None:
    registry = _charge_registry()
    for outcome in (
        execute_step(registry, _task("charge"), NO_DATA),
        asyncio.run(execute_async_step(registry, _task("charge_async"), NO_DATA)),
    ):
        assert outcome.outcome is StepOutcome.FAILED
        assert outcome.error == "KeyError: 'by'" and outcome.error_type == "KeyError"
        trace = outcome.traceback
        assert trace is not None
        frames = _frames(trace)
        assert frames[0].startswith(f'File "{__file__}"')
        assert frames[0].endswith(("in charge", "in charge_async"))  # the user's step first
        assert frames[-1].endswith("in lookup")  # then where it raised
        assert "processor/worker" not in trace  # none of the worker's own frames
        assert trace.startswith("Traceback (most recent call last):")
        assert trace.split("\n")[-1] == "KeyError: 'by'"


def test_a_chained_exception_keeps_both_tracebacks() -> None:
    registry = StepRegistry()

    @registry.step("wraps")
    def wraps(ctx: StepContext) -> Any:
        order: dict[str, Any] = {}
        try:
            return order["by"]
        except KeyError as exc:
            raise RuntimeError("no payer") from exc

    outcome = execute_step(registry, _task("wraps"), NO_DATA)
    assert outcome.error == "RuntimeError: no payer" and outcome.traceback is not None
    assert "KeyError: 'by'" in outcome.traceback
    assert "The above exception was the direct cause" in outcome.traceback
    assert outcome.traceback.split("\n")[-1] == "RuntimeError: no payer"


def test_a_deep_recursion_keeps_a_bounded_traceback() -> None:
    registry = StepRegistry()

    def down(n: int) -> int:
        return down(n + 1) + 1

    @registry.step("deep")
    def deep(ctx: StepContext) -> Any:
        return down(0)

    outcome = execute_step(registry, _task("deep"), NO_DATA)
    trace = outcome.traceback
    assert outcome.error_type == "RecursionError" and trace is not None
    assert len(trace.split("\n")) <= MAX_TRACEBACK_LINES and _bytes(trace) <= MAX_TRACEBACK_BYTES
    assert _frames(trace)[0].endswith("in deep")
    assert trace.split("\n")[-1].startswith("RecursionError: maximum recursion depth exceeded")


def test_an_exception_whose_text_cannot_be_read_still_fails_the_attempt_with_its_type() -> None:
    class Odd(Exception):
        def __str__(self) -> str:
            raise ValueError("no text")

    registry = StepRegistry()

    @registry.step("odd")
    def odd(ctx: StepContext) -> Any:
        raise Odd

    outcome = execute_step(registry, _task("odd"), NO_DATA)
    assert outcome.error == "Odd: <its message could not be read>" and outcome.error_type == "Odd"
    assert outcome.traceback is not None and _frames(outcome.traceback)[0].endswith("in odd")


def test_a_huge_message_and_nul_characters_are_stored_bounded() -> None:
    registry = StepRegistry()

    @registry.step("loud")
    def loud(ctx: StepContext) -> Any:
        raise ValueError("\x00" + "z" * 100_000)

    outcome = execute_step(registry, _task("loud"), NO_DATA)
    assert outcome.error is not None and len(outcome.error) < MAX_ERROR_CHARS + 50
    assert outcome.error.startswith("ValueError: \ufffdzzz")
    assert outcome.traceback is not None and "\x00" not in outcome.traceback
    assert _bytes(outcome.traceback) <= MAX_TRACEBACK_BYTES


def test_an_exception_never_raised_has_a_traceback_of_its_type_alone() -> None:
    assert step_traceback(KeyError("by")) == "KeyError: 'by'\n"


def test_a_process_that_died_says_there_is_no_traceback_and_why() -> None:
    said = no_traceback("the step's process died (killed by signal SIGKILL)")
    assert said.startswith("No traceback: the step's process died (killed by signal SIGKILL).")


# -- how a look at a run shows them ---------------------------------------------------------------


def test_a_value_is_shown_whole_within_its_bound_and_cut_beyond() -> None:
    whole = shown('{"a": [1, 2]}', 13, 13)
    assert whole == Shown({"a": [1, 2]}, 13) and not whole.truncated
    assert whole.text() == '{"a":[1,2]}'
    assert whole.document() == {
        "value": {"a": [1, 2]},
        "truncated": False,
        "chars": 13,
        "preview": None,
    }
    cut = shown('{"a": [1, 2]}', 13, 6)
    assert cut.truncated and cut.value is None and cut.preview == '{"a": '
    assert cut.text() == '{"a":  ... (cut: 13 characters)'
    assert orjson.loads(orjson.dumps(cut.document()))["truncated"] is True


def test_a_steps_own_text_reaches_a_terminal_with_its_control_characters_escaped() -> None:
    hostile = "red \x1b[31m\rback\u202e\nnext line\tand a tab"
    assert printable(hostile) == "red \\x1b[31m\\rback\\u202e\nnext line\tand a tab"
    assert printable("plain é") == "plain é"


def test_the_message_of_an_error_is_read_without_its_type() -> None:
    assert error_message("KeyError: 'by'", "KeyError") == "'by'"
    assert error_message("abandoned: its deadline passed", None) == "abandoned: its deadline passed"
    assert error_message(None, None) is None
